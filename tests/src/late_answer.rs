//! The hand-over rule against a slow path back: an acquire whose answer
//! arrives after its lease's local deadline is not handed to the caller.
//!
//! The scenario: the slow client reaches the server(s) through fault proxies
//! that deliver every answer [`DELAY`] late. Its request runs at once, so
//! the server grants a [`TTL`] lease and expires it long before the grant's
//! answer arrives; a fast client takes the key meanwhile. The slow client
//! must come back without a guard (`None`, `Timeout`, or an error), never
//! with a guard whose lease ran out, and the key must be left to the fast
//! client. Once answers come at once again, the slow client gets the key
//! with a greater fence.

use std::sync::Arc;
use std::time::Duration;

use dlock::{Lock, LockBackend, LockError};

use crate::conformance::unique_key;
use crate::proxy::FaultProxy;

/// The lease asked for: shorter than the delay of its answer.
pub const TTL: Duration = Duration::from_millis(300);
/// How late every answer reaches the slow client.
pub const DELAY: Duration = Duration::from_millis(700);

/// A key for one run of the scenario.
pub fn late_key() -> String {
    unique_key("late-answer")
}

/// Runs the scenario on `key`. `slow` reaches the servers through `proxies` (in pass
/// mode until the scenario delays them), `fast` directly.
pub async fn a_late_grant_is_not_handed_over(
    key: &str,
    slow: Arc<dyn LockBackend>,
    fast: Arc<dyn LockBackend>,
    proxies: &[FaultProxy],
) {
    let slow_lock = Lock::new(key).with_backend(slow).ttl(TTL);
    let fast_lock = Lock::new(key)
        .with_backend(fast)
        .ttl(Duration::from_secs(30));
    // Once on time, so that what a first use prepares (ZooKeeper's key
    // directory) is there: the acquire itself is then one request.
    slow_lock
        .acquire()
        .await
        .expect("the slow client, on time, takes the key")
        .release()
        .await
        .expect("and lets it go");
    proxies.iter().for_each(|p| p.delay_replies(DELAY));

    // One attempt: granted on the server at once, answered after the lease
    // expired there; the fast client takes the key in between.
    let trying = tokio::spawn({
        let lock = slow_lock.clone();
        async move { lock.try_acquire().await }
    });
    // The slow client's request runs at once (only its answer is late), so
    // the server grants the lease before the fast client asks. (Redlock
    // undoes a round whose masters are slower than its per-master limit:
    // there the fast client finds the key free.)
    tokio::time::sleep(TTL / 3).await;
    let other = fast_lock
        .clone()
        .wait(DELAY * 4)
        .acquire()
        .await
        .expect("the fast client takes the key once the slow client's lease expired");
    match trying.await.expect("the slow try_acquire panicked") {
        // Redlock's masters each have a short time limit: too few answered.
        Ok(None) | Err(LockError::Backend { .. } | LockError::Quorum { .. }) => {}
        Ok(Some(guard)) => panic!(
            "a grant answered after its deadline was handed over (held: {}) while another client holds the key",
            guard.is_held()
        ),
        Err(e) => panic!("unexpected error from the slow try_acquire: {e}"),
    }
    assert!(other.is_held(), "the fast client lost the key");

    // Waiting: every grant comes back late, so none is handed over; the wait
    // ends without a guard while the fast client holds on.
    match slow_lock.clone().wait(DELAY * 3).acquire().await {
        Err(LockError::Timeout { .. } | LockError::Backend { .. } | LockError::Quorum { .. }) => {}
        Ok(guard) => panic!(
            "a waiting acquire handed over a late grant (held: {}) while another client holds the key",
            guard.is_held()
        ),
        Err(e) => panic!("unexpected error from the slow acquire: {e}"),
    }
    assert!(other.is_held(), "the fast client lost the key");
    let other_fence = other.fencing_token();
    other.release().await.expect("the fast client lets go");

    // The fast client's stale grants were given back: after the slow client's
    // leases had their time, the key is free for anyone.
    proxies.iter().for_each(FaultProxy::pass);
    tokio::time::sleep(DELAY * 2).await;
    let guard = slow_lock
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("with answers on time the slow client gets the key");
    assert!(guard.is_held());
    if let (Some(theirs), Some(ours)) = (other_fence, guard.fencing_token()) {
        assert!(
            ours > theirs,
            "fence {ours} after the fast client's {theirs}"
        );
    }
    guard.release().await.expect("release");
}
