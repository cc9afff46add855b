//! Compile-time behaviour of `#[distributed_lock]`: what compiles (and
//! runs), and the error each misuse gets, checked against `ui/fail/*.stderr`.
//!
//! Regenerate the expected output after a deliberate message change with
//! `TRYBUILD=overwrite cargo test -p dlock --test ui`, then read every diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
