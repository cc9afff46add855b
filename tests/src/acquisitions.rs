//! Ways of taking a lock that many tests share: once and straight back, or
//! waiting in a task of its own that notes when it came back, for the tests
//! that bound how soon a release reaches a waiter.

use std::time::{Duration, Instant};

use dlock::{Lock, LockError, LockGuard, Semaphore};
use tokio::task::JoinHandle;

/// Acquires `lock` and releases it at once; any error fails the test.
pub async fn acquire_and_release(lock: &Lock) {
    lock.acquire().await.unwrap().release().await.unwrap();
}

/// A waiting acquisition: when it came back, and what with.
pub type Waiting = JoinHandle<(Instant, Result<LockGuard, LockError>)>;

/// Starts `lock`'s acquisition (give it a long wait) in a task of its own.
pub fn wait_for(lock: Lock) -> Waiting {
    tokio::spawn(async move {
        let guard = lock.acquire().await;
        (Instant::now(), guard)
    })
}

/// The waiter's guard; fails the test with `missed` if the waiter never
/// got the lock, or if it got it `limit` or more after `since`.
pub async fn got_within(
    waiting: Waiting,
    since: Instant,
    limit: Duration,
    missed: &str,
) -> LockGuard {
    let (got_at, guard) = waiting.await.expect("the waiting task panicked");
    let guard = guard.unwrap_or_else(|e| panic!("{missed}: {e}"));
    assert!(
        got_at - since < limit,
        "took {:?} (limit {limit:?})",
        got_at - since
    );
    guard
}

/// Acquires a permit of `semaphore` and releases it at once; any error
/// fails the test.
pub async fn acquire_and_release_permit(semaphore: &Semaphore) {
    semaphore.acquire().await.unwrap().release().await.unwrap();
}
