//! The checks of a holder across a failover, shared by the Sentinel and the
//! Cluster tests: a second client waiting for the key the whole time is
//! never granted it while the holder believes it holds it, the holder keeps
//! its lease, and after its release the waiter gets a greater fence.

use std::time::{Duration, Instant};

use std::sync::Arc;

use dlock::{Lock, LockBackend, LockGuard};

use crate::acquisitions::{wait_for, Waiting};

/// The start of every failover case: client `a` takes `key` with `ttl`
/// (panicking with `what` if it cannot), and client `b` starts waiting for
/// it, for up to a minute.
pub async fn held_and_awaited(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
    key: &str,
    ttl: Duration,
    what: &str,
) -> (LockGuard, Waiting) {
    let guard = Lock::new(key)
        .with_backend(a)
        .ttl(ttl)
        .acquire()
        .await
        .expect(what);
    let waiting = wait_for(
        Lock::new(key)
            .with_backend(b)
            .ttl(ttl)
            .wait(Duration::from_secs(60)),
    );
    (guard, waiting)
}

/// Asserts, every 50 ms until `done()` and then for `after` more, that the
/// waiter was not granted the key while `guard` held it; then that `guard`
/// still holds and the waiter still waits. `done()` is polled off the
/// runtime's worker (it may block, as a harness's probe does) and must come
/// within 30 s.
pub async fn held_throughout(
    guard: &LockGuard,
    waiting: &Waiting,
    mut done: impl FnMut() -> bool,
    after: Duration,
) {
    let started = Instant::now();
    let mut done_at = None;
    loop {
        assert!(
            !waiting.is_finished() || !guard.is_held(),
            "the waiter was granted the key while the holder held it"
        );
        if done_at.is_none() && tokio::task::block_in_place(&mut done) {
            done_at = Some(Instant::now());
        }
        match done_at {
            Some(at) if at.elapsed() >= after => break,
            None => assert!(
                started.elapsed() < Duration::from_secs(30),
                "the failover did not end within 30 s"
            ),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        guard.is_held(),
        "the holder's lease did not follow the failover"
    );
    assert!(!waiting.is_finished(), "the waiter was granted a held key");
}

/// Releases `guard`; the waiter is then granted the key, after the release,
/// with a greater fence. Returns how long after the release it was granted.
pub async fn hands_over(guard: LockGuard, waiting: Waiting) -> Duration {
    let fence = guard.fencing_token().expect("a fencing token");
    let released_at = Instant::now();
    guard.release().await.expect("the holder releases");
    let (granted_at, next) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter was not granted the key after the release")
        .expect("the waiting task panicked");
    let next = next.expect("the waiter acquires after the release");
    assert!(granted_at >= released_at, "granted before the release");
    let next_fence = next.fencing_token().expect("a fencing token");
    assert!(
        next_fence > fence,
        "the next fence {next_fence} is not above {fence}"
    );
    next.release().await.expect("the waiter releases");
    granted_at - released_at
}
