//! The session leases: one etcd lease per ttl in whole seconds, shared by
//! the keys of that ttl, granted on first use, kept alive by the renewals of
//! its keys, and revoked once no key uses it for [`SESSION_IDLE`] (see
//! [`Inner::revoke_idle`]) or when the backend is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use super::client::lease_not_found;
use super::{lock, Inner};
use crate::backend::lease_deadline;
use crate::LockError;

/// One lease shared by the keys of one ttl.
pub(super) struct Session {
    pub(super) id: i64,
    /// The ttl etcd granted (it may raise short ones).
    pub(super) granted: Duration,
    /// When the last successful grant or keep-alive was *sent*: the server's
    /// expiry is at least this plus `granted`.
    pub(super) refreshed: Mutex<Instant>,
    /// etcd said the lease is gone; every key on it went with it.
    pub(super) dead: AtomicBool,
    /// The keep-alive stream, opened on first use. Taken out while a
    /// keep-alive is in flight and put back only after its answer was read,
    /// so a keep-alive abandoned half-way (timeout, cancellation) never
    /// leaves a late answer to be mistaken for the next one's.
    pub(super) keeper: tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// When a caller last had the session: handed out by
    /// [`Inner::session`], or seen in use by [`Inner::revoke_idle`].
    pub(super) used: Mutex<Instant>,
}

/// How long a session no key uses is kept before it is revoked.
///
/// Why a few seconds: long enough that a steady stream of acquisitions with
/// one ttl (a job every second or two) keeps reusing its session instead of
/// paying a grant (a raft write) per acquisition; short enough that a
/// process that goes through many ttls keeps only the leases of the last few
/// seconds on the server (a lease of an hour's ttl would otherwise stay for
/// the hour, and for every ttl ever seen). Not a fraction of the ttl: a long
/// ttl says how long a holder may be silent, not how long an unused lease
/// should stay.
pub const SESSION_IDLE: Duration = Duration::from_secs(5);

/// How often the idle sessions are looked for: a session goes between
/// [`SESSION_IDLE`] and this much later.
pub(super) const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long a drop of the backend outside any runtime waits for its
/// sessions' revokes (see `etcd.rs`'s `Drop for Inner`).
pub(super) const SHUTDOWN_REVOKE: Duration = Duration::from_secs(2);

/// The answer of etcd to a keep-alive.
pub(super) enum Alive {
    Yes,
    /// The lease is gone (expired or revoked).
    Gone,
}

impl Inner {
    /// The live session for `ttl`, granting a lease if there is none.
    pub(super) async fn session(&self, ttl: Duration) -> Result<Arc<Session>, LockError> {
        let secs = lease_seconds(ttl);
        let mut sessions = self.sessions.lock().await;
        if let Some(session) = sessions.get(&secs).filter(|s| !s.is_dead()) {
            *lock(&session.used) = Instant::now();
            return Ok(session.clone());
        }
        let sent = Instant::now();
        let granted = self
            .rpc(|| {
                let mut leases = self.client.lease_client();
                async move { leases.grant(secs as i64, None).await }
            })
            .await?;
        let session = Arc::new(Session {
            id: granted.id(),
            granted: Duration::from_secs(granted.ttl().max(0) as u64),
            refreshed: Mutex::new(sent),
            dead: AtomicBool::new(false),
            keeper: tokio::sync::Mutex::new(None),
            used: Mutex::new(Instant::now()),
        });
        sessions.insert(secs, session.clone());
        Ok(session)
    }

    /// Revokes the sessions no key has used for [`SESSION_IDLE`].
    ///
    /// In use means anyone but the map holds the session: a held key's
    /// record, an acquisition between its [`Inner::session`] and its end,
    /// a renewal. Every one of them got it from the map under the map's lock,
    /// which this holds while it decides: a session it takes out is in no
    /// one else's hands and can no longer be handed out, so an acquisition
    /// never gets a lease being revoked; it finds no session and grants a
    /// fresh one. (A clean-up of an abandoned entry may still run: its key
    /// goes with the lease.)
    pub(super) async fn revoke_idle(&self) {
        // First the records of keys past their local deadline (guards
        // dropped where their release could not run): they would keep
        // their session in use for ever once nothing else renews it.
        self.clear_expired().await;
        let idle: Vec<Arc<Session>> = {
            let mut sessions = self.sessions.lock().await;
            let now = Instant::now();
            let mut idle = Vec::new();
            sessions.retain(|_, session| {
                if Arc::strong_count(session) > 1 {
                    *lock(&session.used) = now;
                    return true;
                }
                if now.saturating_duration_since(*lock(&session.used)) < SESSION_IDLE {
                    return true;
                }
                idle.push(session.clone());
                false
            });
            idle
        };
        for session in idle {
            if session.is_dead() {
                continue;
            }
            session.mark_dead();
            let id = session.id;
            let revoked = self
                .rpc(|| {
                    let mut leases = self.client.lease_client();
                    async move { leases.revoke(id).await }
                })
                .await;
            // A failed revoke leaves the lease to expire by its ttl: nothing
            // keeps it alive any more.
            let outcome = match &revoked {
                Ok(_) => "revoked",
                Err(e) if lease_not_found(e) => "expired",
                Err(_) => "failed",
            };
            tracing::debug!(lease = id, outcome, "revoked an idle etcd session lease");
            count_idle_revoke(&self.shown, outcome);
        }
    }

    /// Whether `lease` is one of this backend's session leases.
    pub(super) async fn is_our_lease(&self, lease: i64) -> bool {
        self.sessions.lock().await.values().any(|s| s.id == lease)
    }

    /// Makes sure `session` was refreshed recently enough that a guard taken
    /// now has most of its ttl ahead of it.
    pub(super) async fn fresh(&self, session: &Session, ttl: Duration) -> Result<Alive, LockError> {
        if session.refreshed().elapsed() <= ttl / 4 {
            return Ok(Alive::Yes);
        }
        session.keep_alive(self, Instant::now()).await
    }
}

impl Session {
    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    pub(super) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    pub(super) fn refreshed(&self) -> Instant {
        *lock(&self.refreshed)
    }

    /// The local deadline of a guard of `ttl` on this session.
    pub(super) fn deadline(&self, ttl: Duration) -> Instant {
        lease_deadline(self.refreshed(), ttl.min(self.granted))
    }

    /// Sends a keep-alive, unless one sent at or after `since` already
    /// succeeded (concurrent renewals share one round trip). In the same
    /// moment, deletes the held keys that outlived their local deadline:
    /// the keep-alive must not keep those on the server.
    pub(super) async fn keep_alive(
        &self,
        inner: &Inner,
        since: Instant,
    ) -> Result<Alive, LockError> {
        let (_, alive) = tokio::join!(inner.clear_expired(), self.exchange(inner, since));
        alive
    }

    /// The keep-alive itself (see [`Session::keep_alive`]).
    pub(super) async fn exchange(&self, inner: &Inner, since: Instant) -> Result<Alive, LockError> {
        let mut slot = self.keeper.lock().await;
        if self.is_dead() {
            return Ok(Alive::Gone);
        }
        if self.refreshed() >= since {
            return Ok(Alive::Yes);
        }
        let sent = Instant::now();
        if let Some((mut keeper, mut stream)) = slot.take() {
            let exchange = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            match tokio::time::timeout(inner.timeout, exchange).await {
                Ok(Ok(Some(answer))) => {
                    *slot = Some((keeper, stream));
                    return self.answered(answer.ttl(), sent);
                }
                // The stream's member died or closed it: open a new stream
                // below, which the client may route to another member.
                Ok(Ok(None) | Err(_)) => {}
                Err(_) => {
                    return Err(
                        inner.error(format!("no keep-alive answer within {:?}", inner.timeout))
                    )
                }
            }
        }
        // Opening the stream sends the first keep-alive and reads its answer.
        let opened = inner
            .rpc(|| {
                let mut leases = inner.client.lease_client();
                let id = self.id;
                async move { leases.keep_alive(id).await }
            })
            .await;
        match opened {
            Ok(opened) => {
                *slot = Some(opened);
                self.answered(1, sent)
            }
            Err(e) if lease_not_found(&e) => self.answered(0, sent),
            Err(e) => Err(e),
        }
    }

    /// Records etcd's answer to a keep-alive sent at `sent`.
    pub(super) fn answered(&self, ttl: i64, sent: Instant) -> Result<Alive, LockError> {
        if ttl <= 0 {
            self.mark_dead();
            return Ok(Alive::Gone);
        }
        let mut refreshed = lock(&self.refreshed);
        *refreshed = (*refreshed).max(sent);
        Ok(Alive::Yes)
    }
}

/// `dlock_etcd_idle_sessions_total`: idle session leases given up, by
/// `outcome` (`revoked`, `expired` before the revoke, `failed`).
fn count_idle_revoke(backend: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "dlock_etcd_idle_sessions_total",
        "backend" => backend.to_owned(), "outcome" => outcome
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, outcome);
}

/// Looks for idle sessions every [`IDLE_CHECK`] on dlock's background
/// runtime, for as long as the backend lives: the task holds it only
/// weakly, and ends at the first check after its drop.
pub(super) fn watch_idle(inner: &Arc<Inner>) {
    let inner = Arc::downgrade(inner);
    crate::lease::background::spawn_daemon(async move {
        let mut ticks = tokio::time::interval(IDLE_CHECK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            inner.revoke_idle().await;
        }
    });
}

/// The etcd lease length for a ttl: whole seconds, rounded up, so the server
/// never expires a key before the deadline the caller was promised; at most
/// etcd's maximum (a longer ttl gets a local deadline at that maximum).
pub(super) fn lease_seconds(ttl: Duration) -> u64 {
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0));
    secs.clamp(1, MAX_LEASE_SECONDS)
}

/// `at + span`, or a century on if that overflows the clock (absurd ttls).
pub(super) fn after(at: Instant, span: Duration) -> Instant {
    at.checked_add(span)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(at)
}

/// etcd's `MaxLeaseTTL`.
pub(super) const MAX_LEASE_SECONDS: u64 = 9_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_seconds_round_up_and_stay_in_etcds_range() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), 1);
        assert_eq!(lease_seconds(Duration::from_secs(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
        assert_eq!(lease_seconds(Duration::MAX), MAX_LEASE_SECONDS);
    }

    #[test]
    fn a_ttl_of_duration_max_never_overflows_an_instant() {
        let now = Instant::now();
        for span in [Duration::MAX, Duration::MAX / 4, Duration::MAX / 3] {
            assert!(after(now, span) > now, "{span:?}");
        }
        // A session's deadline takes the granted (clamped) lease, not the ttl.
        let session = Session {
            id: 1,
            granted: Duration::from_secs(MAX_LEASE_SECONDS),
            refreshed: Mutex::new(now),
            dead: AtomicBool::new(false),
            keeper: tokio::sync::Mutex::new(None),
            used: Mutex::new(now),
        };
        assert!(session.deadline(Duration::MAX) > now);
    }
}
