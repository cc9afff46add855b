//! How long a ZooKeeper lease may last: the local deadline must pass before
//! the ensemble's leader can expire the session that holds the node.
//!
//! Only the leader expires sessions, one session timeout after the last time
//! it heard the session was alive. A client connected to a follower is heard
//! of second hand: the follower notes every request of the session and
//! reports them in its reply to the leader's next ping (the leader pings
//! every half tick). So when a request is answered, the leader may not have
//! heard of it yet, and if the follower is cut off from the leader right
//! then, it never will: the leader's last news of the session is then the
//! session's previous request, heartbeat or reconnection, reported before
//! the cut. Counting a lease from the request that took or renewed it would
//! outlive the session by up to that gap (a test on a three-node ensemble
//! saw another client take the lock 4.8 s before such a deadline).
//!
//! The gap is bounded: the leader pinged the follower within half a tick of
//! the answer (the answer came through the leader, see below); the session
//! was active within `3/20 + 1/20` of the session timeout before that
//! (`zookeeper-client` sends a heartbeat after `3/20` of the session timeout
//! without a request, checked every `1/20`); and ZooKeeper grants session
//! timeouts of at least two ticks, so half a tick is at most a quarter of
//! the session timeout. The leader has therefore heard of the session at
//! most `1/4 + 1/5` of the session timeout, plus the request's round trip,
//! before the request was sent, and a lease may last at most the rest:
//! **11/20 of the session timeout** ([`max_ttl`]), less the round trip.
//!
//! The bound rests on two things outside this crate: the server's default
//! `minSessionTimeout` of two ticks (a server configured to grant less lets
//! half a tick exceed a quarter of the session timeout), and
//! `zookeeper-client`'s heartbeat rhythm (revisit [`max_ttl`] when upgrading
//! it).
//!
//! All of this holds only for an answer that went through the leader, which
//! a follower cut off from it can give for up to `syncLimit × tickTime`
//! without: reads are answered by the follower alone. So the request a lease
//! is counted from is a write (the create, for a lock granted by the listing
//! sent right behind it: `try_acquire`, and an `acquire` that did not wait),
//! or a read that follows a `sync` in the same session (the listing that
//! ends an `acquire`'s wait, renewals, permits): a follower answers it only
//! after the leader answered the sync.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::backend::lease_deadline;

/// The WARN, once per backend, that a ttl was cut to what the session can
/// back. Granted, not refused: the default ttl (30 s) is longer than the
/// default session (30 s) can back (16.5 s), so refusing would fail the
/// default configuration, while the cut lease is safe (its local deadline
/// is the cut one) and renewal keeps it for as long as the holder runs.
#[derive(Debug, Default)]
pub(super) struct CutTtlWarning {
    warned: AtomicBool,
}

impl CutTtlWarning {
    /// Warns (the first time only) when `ttl` is longer than [`max_ttl`]
    /// of `session_timeout`.
    pub(super) fn check(&self, backend: &str, ttl: Duration, session_timeout: Duration) {
        let longest = max_ttl(session_timeout);
        if ttl <= longest || self.warned.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            backend = %backend,
            ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            granted_ms = u64::try_from(longest.as_millis()).unwrap_or(u64::MAX),
            session_timeout_ms = u64::try_from(session_timeout.as_millis()).unwrap_or(u64::MAX),
            "ttl longer than the ZooKeeper session can back: each lease lasts at most 11/20 of session_timeout between renewals; raise `?session_timeout=` on the URL (to about twice the ttl) for the full ttl"
        );
    }
}

/// The longest lease a session with this timeout can back: 11/20 of it
/// (see the module docs).
pub(super) fn max_ttl(session_timeout: Duration) -> Duration {
    session_timeout / 20 * 11
}

/// The local deadline of a lease of `ttl` whose leader-confirmed request was
/// sent at `sent` and answered at `answered`, on a session with this timeout:
/// the ttl (clamped to [`max_ttl`]) less the drift margin, and never later
/// than `max_ttl` less the request's round trip, which bounds how long the
/// follower's news of the session took to reach the leader.
pub(super) fn deadline(
    sent: Instant,
    answered: Instant,
    ttl: Duration,
    session_timeout: Duration,
) -> Instant {
    let longest = max_ttl(session_timeout);
    let by_ttl = lease_deadline(sent, ttl.min(longest));
    let round_trip = answered.saturating_duration_since(sent);
    let by_session = lease_deadline(sent, longest)
        .checked_sub(round_trip)
        .map_or(sent, |d| d.max(sent));
    by_ttl.min(by_session)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lasts_at_most_eleven_twentieths_of_the_session() {
        let session = Duration::from_secs(40);
        assert_eq!(max_ttl(session), Duration::from_secs(22));
        let sent = Instant::now();
        // A ttl within the bound keeps its own deadline.
        assert_eq!(
            deadline(sent, sent, Duration::from_secs(10), session),
            lease_deadline(sent, Duration::from_secs(10))
        );
        // A longer one is cut to the bound.
        assert_eq!(
            deadline(sent, sent, session, session),
            lease_deadline(sent, Duration::from_secs(22))
        );
        // Whatever the ttl, no overflow.
        assert_eq!(
            deadline(sent, sent, Duration::MAX, session),
            lease_deadline(sent, Duration::from_secs(22))
        );
    }

    #[test]
    fn the_cut_is_warned_once() {
        let warning = CutTtlWarning::default();
        let session = Duration::from_secs(30);
        warning.check("zk://h", Duration::from_secs(10), session);
        assert!(
            !warning.warned.load(Ordering::Relaxed),
            "10 s fits in 16.5 s"
        );
        warning.check("zk://h", Duration::from_secs(120), session);
        assert!(warning.warned.load(Ordering::Relaxed));
    }

    #[test]
    fn a_slow_answer_shortens_the_lease_by_its_round_trip() {
        let session = Duration::from_secs(40);
        let sent = Instant::now();
        let answered = sent + Duration::from_secs(3);
        assert_eq!(
            deadline(sent, answered, session, session),
            lease_deadline(sent, Duration::from_secs(22)) - Duration::from_secs(3)
        );
        // A short ttl is not cut while the bound still leaves room for it.
        assert_eq!(
            deadline(sent, answered, Duration::from_secs(5), session),
            lease_deadline(sent, Duration::from_secs(5))
        );
        // An answer slower than the whole bound leaves nothing.
        let late = sent + Duration::from_secs(60);
        assert_eq!(deadline(sent, late, session, session), sent);
    }
}
