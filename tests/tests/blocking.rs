//! The synchronous API against a real Redis server, from plain threads.

use std::sync::Arc;
use std::time::Duration;

use dlock::{Lock, LockBackend, LockError};
use dlock_tests::servers::redis::RedisServer;

fn connect(url: &str) -> Arc<dyn LockBackend> {
    // `connect` is async; its connections live on dlock's own runtime, so a
    // runtime made just for the call may go away afterwards.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(dlock::connect(url)).unwrap()
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
