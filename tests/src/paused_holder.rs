//! Two fencing tokens of one key, as a paused holder and the holder after
//! it get them: the first lease is taken without renewal (a holder that
//! stopped renewing: paused) and left to expire before the second is
//! granted. The fenced-write tests write with both, the stale one last.

use std::time::Duration;

use dlock::{Lock, LockGuard};

/// The fences of a paused holder and of the holder after it, on the lock
/// `key` of the backend at `url`: `(stale, current)`, `stale < current`.
pub async fn stale_and_current(url: &str, key: &str) -> (u64, u64) {
    let backend = dlock::connect(url).await.unwrap();
    let ttl = Duration::from_millis(500);
    let paused: LockGuard = Lock::new(key)
        .with_backend(backend.clone())
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    // The paused holder's lease runs out; the next holder is granted.
    let next = Lock::new(key)
        .with_backend(backend)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(!paused.is_held(), "the first lease outlived its ttl");
    let (stale, current) = (
        paused.fencing_token().unwrap(),
        next.fencing_token().unwrap(),
    );
    assert!(stale < current, "fences {stale} then {current}");
    next.release().await.unwrap();
    (stale, current)
}
