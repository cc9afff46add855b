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
            let wake = Instant::now() + left + jitter(left / 10 + Duration::from_millis(2));
            let wake = deadline.map_or(wake, |d| d.min(wake));
            tokio::select! {
                () = released.changed() => {}
                () = tokio::time::sleep_until(wake.into()) => {}
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
        }
    }
}
