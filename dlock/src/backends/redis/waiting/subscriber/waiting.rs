//! The wait for a release, shared by locks and semaphore permits: what a
//! waiter does with its subscription.

use std::future::Future;
use std::time::{Duration, Instant};

use super::turn::Ticket;
use super::turned;
use crate::backend::Lease;
use crate::backends::redis::protocol::scripts::queue_lua::HEARTBEAT;
use crate::backends::redis::waiting::recheck::Recheck;
use crate::backends::redis::{jitter, Attempt, RedisBackend};
use crate::LockError;

/// One try of a waiting acquisition: done, or held by someone else, by the
/// watched key at `on` (`None`: nothing to re-check), for `left` if the
/// server knows.
pub(in crate::backends::redis) enum Try<T> {
    Done(T),
    Held {
        on: Option<usize>,
        left: Option<Duration>,
    },
}

/// What a waiter watches: a release channel, and a Redis key whose
/// disappearance can be noticed without a release message (keyspace
/// notifications, the re-check). Semaphores have no key; a read-write
/// lock's one channel goes with the first of its keys.
pub(in crate::backends::redis) struct Watched<'a> {
    pub(in crate::backends::redis) channel: Option<&'a str>,
    pub(in crate::backends::redis) key: Option<&'a str>,
}

/// How a waiter waits, besides what it watches.
pub(in crate::backends::redis) struct Pace {
    /// The nap after a try that found a holder of unknown expiry.
    pub(in crate::backends::redis) unknown_expiry: Duration,
    /// The longest nap between tries (a waiting writer refreshes its mark).
    pub(in crate::backends::redis) at_most: Option<Duration>,
}

impl RedisBackend {
    /// Runs `attempt` until it acquires or `deadline` passes (`Ok(None)`):
    /// [`wait_on_keys`](Self::wait_on_keys) for one key, queued as `ticket`
    /// if given (`attempt(true)`: this try may queue).
    pub(in crate::backends::redis) async fn wait_for_release<F, Fut>(
        &self,
        channel: &str,
        key: Option<&str>,
        ticket: Option<&Ticket<'_>>,
        deadline: Option<Instant>,
        unknown_expiry: Duration,
        mut attempt: F,
    ) -> Result<Option<Lease>, LockError>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<Attempt, LockError>>,
    {
        let watched = [Watched {
            channel: Some(channel),
            key,
        }];
        // A queued waiter's ticket is kept alive by its backend's
        // heartbeat (see `turns.rs`), and its turn comes as a message
        // (where the server refuses dlock's channels, see `wait_on_keys`).
        let pace = Pace {
            unknown_expiry,
            at_most: None,
        };
        let waited = self
            .wait_on_keys(&watched, ticket, deadline, pace, |queued| {
                let tried = attempt(queued);
                async move {
                    Ok(match tried.await? {
                        Attempt::Acquired(lease) => Try::Done(lease),
                        Attempt::Held(left) => Try::Held { on: Some(0), left },
                        Attempt::Behind(left) => Try::Held { on: None, left },
                    })
                }
            })
            .await?;
        Ok(waited.ok())
    }

    /// Runs `attempt` until it is done or `deadline` passes (`Ok(Err(on))`,
    /// `on` what the last try found in the way).
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
    /// `pace.unknown_expiry`, and no nap is longer than `pace.at_most`.
    ///
    /// A waiter with a `ticket` (a lock's, see `waiter_queue.rs`) registers
    /// it with its subscription, and every try after that is told it may
    /// queue (`attempt(true)`): a turn given to the ticket then wakes this
    /// waiter, and nobody else. When its key's channel is subscribed
    /// already (another waiter of this process, or one that left within
    /// the subscriber's linger), subscribing costs no round trip, so the
    /// waiter subscribes first and its first try queues: a key that
    /// processes take in turns costs no plain try per wait.
    pub(in crate::backends::redis) async fn wait_on_keys<T, F, Fut>(
        &self,
        watched: &[Watched<'_>],
        ticket: Option<&Ticket<'_>>,
        deadline: Option<Instant>,
        pace: Pace,
        mut attempt: F,
    ) -> Result<Result<T, Option<usize>>, LockError>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<Try<T>, LockError>>,
    {
        let turns = self.subscriber.turn_channel();
        let warm = ticket.is_some()
            && self.subscriber.is_subscribed(turns)
            && watched
                .first()
                .and_then(|one| one.channel)
                .is_some_and(|channel| self.subscriber.is_subscribed(channel));
        if !warm {
            let first_on = match attempt(false).await? {
                Try::Done(done) => return Ok(Ok(done)),
                Try::Held { on, .. } => on,
            };
            // Out of time already (the first try was cut off at the
            // deadline): no subscription, no second try.
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(Err(first_on));
            }
        }
        let mut channels: Vec<String> = Vec::with_capacity(2 * watched.len() + 1);
        if ticket.is_some() {
            channels.push(turns.to_owned());
        }
        for one in watched {
            channels.extend(one.channel.map(str::to_owned));
            channels.extend(one.key.and_then(|k| self.keyspace_channel(k)));
        }
        let mut released = self.subscriber.subscribe(&channels, deadline).await;
        if let Some(ticket) = ticket {
            released.queue_as(ticket.get());
        }
        let turn = released.turn();
        // The re-checks of the key in the way, and when its holder's lease
        // ends as last seen.
        let mut rechecks: Option<(&str, Recheck)> = None;
        let mut in_way_until: Option<Instant> = None;
        // The heartbeat of the ticket, from its first queued try on.
        let mut beating = None;
        loop {
            released.mark_seen();
            // Polled and trying: a turn given meanwhile is being taken (the
            // heartbeat leaves in line only a waiter that takes its turns).
            if let Some(turn) = &turn {
                turn.taken();
            }
            let sent = Instant::now();
            let (on, left) = match attempt(ticket.is_some()).await? {
                Try::Done(done) => return Ok(Ok(done)),
                Try::Held { on, left } => (on, left.unwrap_or(pace.unknown_expiry)),
            };
            if let (Some(ticket), None) = (ticket, &beating) {
                let lock = watched.first().and_then(|one| one.key).unwrap_or_default();
                let channel = watched
                    .first()
                    .and_then(|one| one.channel)
                    .unwrap_or_default();
                beating = Some(self.beat_while_queued(lock, channel, ticket.get(), turn.clone()));
            }
            // A queued try answered without the key kept the ticket in line.
            if let (Some(beating), true) = (&beating, deadline.is_none_or(|d| d > Instant::now())) {
                beating.proven(sent);
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(Err(on));
            }
            let mut nap = left.saturating_add(jitter(left / 10 + Duration::from_millis(2)));
            if let Some(at_most) = pace.at_most {
                nap = nap.min(at_most);
            }
            // No turn can reach a queued waiter whose server refuses
            // dlock's channels (known once subscribed): it tries every
            // heartbeat itself.
            if ticket.is_some() && self.subscriber.release_refused() {
                nap = nap.min(HEARTBEAT);
            }
            let expiry = nap_until(nap, deadline);
            tokio::pin!(expiry);
            // A new schedule when the key in the way changed hands (its
            // expiry moved later: a new holder, perhaps a foreign one, or a
            // renewal). A queued waiter does not re-check at all: its
            // backend's heartbeat looks at the key once per beat for all
            // its waiters, and wakes the head of a key left free (see
            // `turns.rs`). Nor does a queued waiter with someone live
            // ahead of it (`on` is `None`) wake on the key's messages
            // (keyspace events, listeners' `1`): its turn comes to it.
            let listens = ticket.is_none() || on.is_some();
            let key = on
                .filter(|_| ticket.is_none())
                .and_then(|on| watched.get(on))
                .and_then(|one| one.key);
            let until = Instant::now().checked_add(left);
            let moved = match (until, in_way_until) {
                (Some(now), Some(before)) => now > before + Duration::from_millis(10),
                _ => true,
            };
            in_way_until = until;
            match key {
                None => rechecks = None,
                Some(key) if moved || rechecks.as_ref().is_none_or(|(k, _)| *k != key) => {
                    rechecks = self.recheck().map(|schedule| (key, schedule));
                }
                Some(_) => {}
            }
            loop {
                let recheck = async {
                    let Some((key, schedule)) = rechecks.as_mut() else {
                        return std::future::pending().await;
                    };
                    tokio::time::sleep(schedule.pause()).await;
                    self.key_is_free(key).await
                };
                let changed = async {
                    if listens {
                        released.changed().await;
                    } else {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    () = changed => break,
                    () = turned(turn.as_deref()) => break,
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
