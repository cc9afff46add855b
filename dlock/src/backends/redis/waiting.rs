//! The wait for a release, shared by locks and semaphore permits.

use std::future::Future;
use std::time::{Duration, Instant};

use super::{jitter, Attempt, RedisBackend};
use crate::backend::Lease;
use crate::LockError;

impl RedisBackend {
    /// Runs `attempt` until it acquires or `deadline` passes (`Ok(None)`).
    ///
    /// A free key is taken without touching the subscriber: most
    /// acquisitions are uncontended, and a `SUBSCRIBE` round trip on each
    /// would cost more than the lock itself. When busy: subscribe to
    /// `channel`, then try again before waiting, so a release between the
    /// failed try and the subscription is not missed. Then wait for a release
    /// message or the holder's expiry (expiry publishes nothing), with
    /// jitter, and try again. Never a fixed-interval poll. A holder of
    /// unknown expiry (a key without one) is retried after `unknown_expiry`.
    pub(super) async fn wait_for_release<F, Fut>(
        &self,
        channel: &str,
        deadline: Option<Instant>,
        unknown_expiry: Duration,
        mut attempt: F,
    ) -> Result<Option<Lease>, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Attempt, LockError>>,
    {
        if let Attempt::Acquired(lease) = attempt().await? {
            return Ok(Some(lease));
        }
        let mut released = self.subscriber.subscribe(channel, deadline).await;
        loop {
            released.mark_seen();
            let left = match attempt().await? {
                Attempt::Acquired(lease) => return Ok(Some(lease)),
                Attempt::Held(left) => left.unwrap_or(unknown_expiry),
            };
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
            let nap = left.saturating_add(jitter(left / 10 + Duration::from_millis(2)));
            tokio::select! {
                () = released.changed() => {}
                () = nap_until(nap, deadline) => {}
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
        }
    }
}

/// Sleeps for `nap`, or until `deadline` if that comes first. Computed as
/// durations, never as `Instant + Duration`: a nap of a lifetime (a holder
/// with a huge ttl) or the farthest deadline must not overflow the clock.
pub(crate) async fn nap_until(nap: Duration, deadline: Option<Instant>) {
    let nap = deadline.map_or(nap, |d| {
        nap.min(d.saturating_duration_since(Instant::now()))
    });
    // tokio's `sleep` takes any duration (an overflowing one sleeps "forever").
    tokio::time::sleep(nap).await;
}
