//! The wait for a release, shared by locks and semaphore permits: what a
//! waiter does with its subscription.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::backend::Lease;
use crate::backends::redis::{jitter, Attempt, RedisBackend};
use crate::LockError;

impl RedisBackend {
    /// Runs `attempt` until it acquires or `deadline` passes (`Ok(None)`).
    ///
    /// A free key is taken without touching the subscriber: most
    /// acquisitions are uncontended, and a `SUBSCRIBE` round trip on each
    /// would cost more than the lock itself. When busy: subscribe to
    /// `channel` (and to the keyspace channel of `key` where the server
    /// notifies), then try again before waiting, so a release between the
    /// failed try and the subscription is not missed. Then wait for a
    /// release message, the holder's expiry (expiry publishes nothing) with
    /// jitter, or a re-check that finds `key` gone (a release that published
    /// nothing: see `recheck.rs`), and try again. A holder of unknown expiry
    /// (a key without one) is retried after `unknown_expiry`. Without `key`
    /// (semaphores) there is no keyspace channel and no re-check.
    pub(in crate::backends::redis) async fn wait_for_release<F, Fut>(
        &self,
        channel: &str,
        key: Option<&str>,
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
        let mut channels = vec![channel.to_owned()];
        channels.extend(key.and_then(|k| self.keyspace_channel(k)));
        let mut released = self.subscriber.subscribe(&channels, deadline).await;
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
            let expiry = nap_until(nap, deadline);
            tokio::pin!(expiry);
            // A new schedule per try: a new holder may be a foreign one.
            let mut rechecks = key.and_then(|key| Some((key, self.recheck()?)));
            loop {
                let recheck = async {
                    let Some((key, schedule)) = rechecks.as_mut() else {
                        return std::future::pending().await;
                    };
                    tokio::time::sleep(schedule.pause()).await;
                    self.key_is_free(key).await
                };
                tokio::select! {
                    () = released.changed() => break,
                    () = &mut expiry => break,
                    free = recheck => match free {
                        Ok(true) => break,
                        Ok(false) => {}
                        // The next try reports an outage; until then the
                        // other wake-ups stand.
                        Err(e) => tracing::debug!(error = %e, "re-check failed"),
                    },
                }
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
