//! A wait rides through what passes: an acquisition with time left in its
//! wait asks again after a transient failure (`backend/transient.rs`: no
//! answer in time, a reset or refused connection, a server restarting, a
//! failover), with a growing pause, and fails with the last error only
//! when its wait is over.
//!
//! Why here, once, and not in each backend: every lease of every kind
//! (locks, read-write locks, permits, election campaigns, several keys)
//! is taken through `lease/acquire.rs`, on every backend. Before this a
//! pause of the network shorter than the wait failed Redis and PostgreSQL
//! waits at the first request that timed out.
//!
//! Each new attempt has a new owner token (`acquire.rs` makes one per
//! backend call): the attempt that failed may have been granted after all,
//! and whatever releases it (the backend's release-if-dropped, the server's
//! expiry) must not touch the lease of the next attempt.
//!
//! A wait of zero (`try_acquire`, `wait(0)`) asked for one attempt and
//! fails at once, as before. A wait without a limit rides through
//! [`NO_WAIT_LIMIT`] of failures in a row, then fails: an outage still
//! shows as an error rather than a hang.

use std::time::{Duration, Instant};

use crate::backend::deadline::saturating_add;
use crate::backend::transient::is_transient;
use crate::LockError;

/// The first pause after a failure: short, since most failures that pass
/// pass at once (a connection retired and opened anew).
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause: a server that is back is found within this.
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// How long a wait without a limit rides through failures in a row.
pub(crate) const NO_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The failures of one acquisition so far.
#[derive(Debug)]
pub(crate) struct RideThrough {
    once: bool,
    deadline: Option<Instant>,
    pause: Duration,
    /// When the current run of failures began.
    failing_since: Option<Instant>,
    failures: u32,
}

impl RideThrough {
    /// For an acquisition of one attempt (`once`) or waiting up to
    /// `deadline` (`None`: no limit).
    pub(crate) fn new(once: bool, deadline: Option<Instant>) -> Self {
        RideThrough {
            once,
            deadline,
            pause: FIRST_PAUSE,
            failing_since: None,
            failures: 0,
        }
    }

    /// After `error` of an attempt on `key`: waits the pause before the
    /// next attempt and returns `Ok`, or returns `error` when it does not
    /// pass or the wait is over.
    pub(crate) async fn after(&mut self, key: &str, error: LockError) -> Result<(), LockError> {
        if self.once || !is_transient(&error) {
            return Err(error);
        }
        let now = Instant::now();
        let give_up = self.give_up(now);
        let pause = self.pause;
        if saturating_add(now, pause) >= give_up {
            tracing::debug!(key, failures = self.failures + 1, error = %error,
                "the wait is over; the acquisition fails with its last error");
            return Err(error);
        }
        self.failures += 1;
        tracing::debug!(key, failures = self.failures, ?pause, error = %error,
            "an attempt failed on a transient error; asking again within the wait");
        tokio::time::sleep(pause).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        Ok(())
    }

    /// When the current run of failures, which had one at `now`, ends the
    /// acquisition.
    fn give_up(&mut self, now: Instant) -> Instant {
        let since = *self.failing_since.get_or_insert(now);
        self.deadline
            .unwrap_or_else(|| saturating_add(since, NO_WAIT_LIMIT))
    }

    /// An attempt on `key` answered (granted or not): the run of failures,
    /// if any, is over.
    pub(crate) fn answered(&mut self, key: &str) {
        if self.failures > 0 {
            tracing::info!(
                key,
                failures = self.failures,
                "dlock: an acquisition rode through transient failures"
            );
        }
        self.failures = 0;
        self.failing_since = None;
        self.pause = FIRST_PAUSE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reset() -> LockError {
        LockError::backend(
            "test://",
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        )
    }

    #[tokio::test]
    async fn one_attempt_fails_at_once() {
        let mut ride = RideThrough::new(true, None);
        assert!(ride.after("k", reset()).await.is_err());
    }

    #[tokio::test]
    async fn a_refusal_fails_at_once() {
        let mut ride = RideThrough::new(false, None);
        let refused = LockError::backend("test://", "NOPERM");
        assert!(ride.after("k", refused).await.is_err());
    }

    #[tokio::test]
    async fn transient_failures_are_asked_again_until_the_deadline() {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(1200);
        let mut ride = RideThrough::new(false, Some(deadline));
        let mut retries = 0;
        while ride.after("k", reset()).await.is_ok() {
            retries += 1;
            assert!(Instant::now() < deadline, "a pause went past the deadline");
        }
        // 50 + 100 + 200 + 400 ms fit in 1.2 s, the next 500 ms do not
        // (give or take a slow timer).
        assert!((3..=5).contains(&retries), "{retries} retries");
        assert!(start.elapsed() < Duration::from_millis(1200));
    }

    #[test]
    fn a_wait_without_limit_gives_up_after_a_minute_of_failures() {
        let mut ride = RideThrough::new(false, None);
        let first = Instant::now();
        assert_eq!(ride.give_up(first), first + NO_WAIT_LIMIT);
        // Counted from the first failure of the run, not from each.
        assert_eq!(
            ride.give_up(first + Duration::from_secs(5)),
            first + NO_WAIT_LIMIT
        );
        ride.answered("k");
        let later = first + Duration::from_secs(90);
        assert_eq!(ride.give_up(later), later + NO_WAIT_LIMIT);
    }
}
