//! Compile-time behaviour of `#[distributed_lock]`: what compiles (and
//! runs), and the error each misuse gets, checked against `ui/fail/*.stderr`.
//!
//! trybuild builds `dlock` again in a project of its own, with the features
//! of this run. With the backends on, that rebuilds the gRPC, ZooKeeper and
//! TLS stacks (about eight minutes on two cores) for cases that only use
//! the memory backend, so these cases compile with the `axum` feature alone
//! (light: `axum-core` and `http`; it is what makes the error of a return
//! type that cannot carry a `LockError` name `HttpError`):
//! `scripts/test.sh` runs them as
//! `cargo test -p dlock-rs --no-default-features --features axum --test ui`.
//!
//! Regenerate the expected output after a deliberate message change with
//! `TRYBUILD=overwrite cargo test -p dlock-rs --no-default-features --features axum --test ui`,
//! then read every diff.
#![cfg(all(
    feature = "axum",
    not(any(
        feature = "redis",
        feature = "redlock",
        feature = "etcd",
        feature = "zookeeper",
        feature = "postgres",
        feature = "tls"
    ))
))]

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
