//! The wait for a release, shared by locks and semaphore permits: what a
//! waiter does with its subscription.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::backend::Lease;
use crate::backends::redis::{jitter, Attempt, RedisBackend};
use crate::LockError;

/// One try of a waiting acquisition: done, or held by someone else, on the
/// watched key at `on`, for `left` if the server knows.
pub(in crate::backends::redis) enum Try<T> {
    Done(T),
    Held { on: usize, left: Option<Duration> },
}

/// A key a waiter watches: its release channel, and its Redis key where a
/// release that published nothing can be noticed (keyspace notifications,
/// the re-check); `None` for semaphores.
pub(in crate::backends::redis) struct Watched<'a> {
    pub(in crate::backends::redis) channel: &'a str,
    pub(in crate::backends::redis) key: Option<&'a str>,
}

impl RedisBackend {
    /// Runs `attempt` until it acquires or `deadline` passes (`Ok(None)`):
    /// [`wait_on_keys`](Self::wait_on_keys) for one key.
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
        let watched = [Watched { channel, key }];
        let waited = self
            .wait_on_keys(&watched, deadline, unknown_expiry, || {
                let tried = attempt();
                async move {
                    Ok(match tried.await? {
                        Attempt::Acquired(lease) => Try::Done(lease),
                        Attempt::Held(left) => Try::Held { on: 0, left },
                    })
                }
            })
            .await?;
        Ok(waited.ok())
    }

    /// Runs `attempt` until it is done or `deadline` passes (`Ok(Err(on))`,
    /// `on` the watched key last found held).
    ///
    /// A free key is taken without touching the subscriber: most
    /// acquisitions are uncontended, and a `SUBSCRIBE` round trip on each
    /// would cost more than the lock itself. When busy: subscribe to every
    /// watched channel (and to the keyspace channel of each key where the
    /// server notifies), then try again before waiting, so a release between
    /// the failed try and the subscription is not missed. Then wait for a
    /// release message, the holder's expiry (expiry publishes nothing) with
    /// jitter, or a re-check that finds the key in the way gone (a release
    /// that published nothing: see `recheck.rs`), and try again. A holder
    /// of unknown expiry (a key without one) is retried after
    /// `unknown_expiry`.
    pub(in crate::backends::redis) async fn wait_on_keys<T, F, Fut>(
        &self,
        watched: &[Watched<'_>],
        deadline: Option<Instant>,
        unknown_expiry: Duration,
        mut attempt: F,
    ) -> Result<Result<T, usize>, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Try<T>, LockError>>,
    {
        if let Try::Done(done) = attempt().await? {
            return Ok(Ok(done));
        }
        let mut channels: Vec<String> = Vec::with_capacity(2 * watched.len());
        for one in watched {
            channels.push(one.channel.to_owned());
            channels.extend(one.key.and_then(|k| self.keyspace_channel(k)));
        }
        let mut released = self.subscriber.subscribe(&channels, deadline).await;
        loop {
            released.mark_seen();
            let (on, left) = match attempt().await? {
                Try::Done(done) => return Ok(Ok(done)),
                Try::Held { on, left } => (on, left.unwrap_or(unknown_expiry)),
            };
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(Err(on));
            }
            let nap = left.saturating_add(jitter(left / 10 + Duration::from_millis(2)));
            let expiry = nap_until(nap, deadline);
            tokio::pin!(expiry);
            // A new schedule per try: a new holder may be a foreign one.
            let key = watched.get(on).and_then(|one| one.key);
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
                return Ok(Err(on));
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
