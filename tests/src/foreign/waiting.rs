//! The waiter side of the foreign-release tests, shared by Redis and Redlock:
//! the timings, a dlock waiter in a task, and how late it got the lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError, LockGuard};
use tokio::task::JoinHandle;

/// The foreign holder's ttl: what a waiter that misses the release sleeps for.
pub const FOREIGN_TTL: Duration = Duration::from_secs(10);
/// When the foreign holder lets go, after the waiter started waiting.
pub const HOLD: Duration = Duration::from_millis(1500);
/// How long after the release the waiter must hold the lock by default.
pub const BY_RECHECK: Duration = Duration::from_millis(1200);
/// How long after a `DEL` the waiter must hold the lock with keyspace
/// notifications on (the goal is 50 ms; the bound is generous for a loaded
/// host, and still far below the 1 s re-check).
pub const BY_NOTIFICATION: Duration = Duration::from_millis(200);

/// What a waiter task answers: the guard, and the instant it got it.
pub type Waiter = JoinHandle<(Result<LockGuard, LockError>, Instant)>;

/// Starts `lock.acquire()` on `key` (wait [`FOREIGN_TTL`]) in a task.
pub fn wait_for(key: &str, backend: Arc<dyn LockBackend>) -> Waiter {
    let lock = Lock::new(key)
        .with_backend(backend)
        .ttl(Duration::from_secs(5))
        .wait(FOREIGN_TTL);
    tokio::spawn(async move {
        let guard = lock.acquire().await;
        (guard, Instant::now())
    })
}

/// The waiter's guard and how long after `released` it got the lock; fails
/// the test, naming `what` released it, if it never did.
pub async fn took(waiter: Waiter, released: Instant, what: &str) -> (LockGuard, Duration) {
    let (guard, at) = waiter.await.expect("the waiter task");
    let guard = guard.unwrap_or_else(|e| {
        panic!(
            "{what}: the waiter never got the lock ({e}) although it was released {:?} before \
             the wait ran out",
            FOREIGN_TTL - HOLD
        )
    });
    let late = at.saturating_duration_since(released);
    println!("{what}: the waiter held the lock {late:?} after the release");
    (guard, late)
}

/// The foreign holder's `PTTL` in the tests where nothing wakes the waiter
/// but the holder's expiry (`recheck_ms=0`, no notifications).
pub const SHORT_FOREIGN_TTL: Duration = Duration::from_secs(3);

/// Waits for `waiter`, started at `started` behind a holder whose key
/// expires [`SHORT_FOREIGN_TTL`] later, and checks that it got the lock at
/// that expiry: not before (nothing else may wake it), nor long after.
/// `what` names the setting in the messages. Returns the guard.
pub async fn woke_at_the_holders_expiry(waiter: Waiter, started: Instant, what: &str) -> LockGuard {
    let (guard, at) = waiter.await.expect("the waiter task");
    let guard = guard.expect("the waiter got the lock at the old holder's expiry");
    let after = at - started;
    println!(
        "{what}: the waiter held the lock {after:?} after it started (PTTL {SHORT_FOREIGN_TTL:?})"
    );
    assert!(
        after >= SHORT_FOREIGN_TTL - Duration::from_millis(500),
        "{what}: the waiter should sleep to the PTTL, woke after {after:?}"
    );
    assert!(
        after < SHORT_FOREIGN_TTL * 2,
        "{what}: woke {after:?} after it started"
    );
    guard
}
