//! The synchronous API against a real Redis server, from plain threads.

use std::sync::Arc;
use std::time::Duration;

use dlock::{Lock, LockBackend, LockError};
use dlock_tests::servers::redis::RedisServer;

fn connect(url: &str) -> Arc<dyn LockBackend> {
    dlock::connect_blocking(url).unwrap()
}

#[test]
fn renewal_goes_on_while_the_calling_thread_sleeps_past_the_ttl() {
    let server = RedisServer::start();
    let ours = connect(&server.url());
    let other = connect(&server.url());
    let ttl = Duration::from_millis(500);
    let lock = Lock::new("blocking:renewed").ttl(ttl).with_backend(ours);
    let guard = lock.acquire_blocking().unwrap();
    std::thread::sleep(ttl * 3);
    assert!(guard.is_held(), "not renewed while the thread slept");
    let theirs = Lock::new("blocking:renewed").with_backend(other);
    assert!(theirs.try_acquire_blocking().unwrap().is_none());
    guard.release_blocking().unwrap();
    let next = theirs
        .try_acquire_blocking()
        .unwrap()
        .expect("free after release_blocking");
    next.release_blocking().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn inside_a_runtime_it_is_a_clear_error_not_a_panic() {
    let backend = dlock::connect("memory://").await.unwrap();
    let lock = Lock::new("blocking:in-runtime").with_backend(backend);
    let err = lock.acquire_blocking().unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("acquire().await"), "{err}");
    let guard = lock.acquire().await.unwrap();
    let err = guard.release_blocking().unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
}

/// The blocking example (`examples/examples/blocking_migration.rs`, a plain
/// `fn main()`), two instances at once against one Redis: one migrates,
/// holding the lock through 3.2 s of blocking steps with a 1 s ttl; the
/// other finds it held and exits 75 without doing anything.
#[test]
fn the_blocking_example_migrates_once_across_two_instances() {
    let server = RedisServer::start();
    let mut dir = std::env::current_exe().unwrap();
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let example = dir.join("examples").join("blocking_migration");
    assert!(
        example.exists(),
        "{} is missing: build it with `cargo build -p dlock-examples --example blocking_migration`",
        example.display()
    );
    let run = || {
        std::process::Command::new(&example)
            .env("DLOCK_URL", server.url())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the example")
    };
    let first = run();
    std::thread::sleep(Duration::from_millis(500));
    let second = run();
    let second = second.wait_with_output().unwrap();
    let first = first.wait_with_output().unwrap();
    assert_eq!(second.status.code(), Some(75), "{second:?}");
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    let said = String::from_utf8_lossy(&first.stdout);
    assert!(said.contains("held throughout"), "{said}");
}
