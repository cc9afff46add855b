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
//! fails at once, as before. A wait without a limit is left to the backend
//! (Redis behind Sentinel rides a failover for up to a minute, etcd gives
//! up after a ttl without an answer): an outage then shows as an error
//! rather than a hang.
//!
//! A wait that ends while the service is failing ends with the last
//! failure, not with `Timeout`: an attempt that followed failures and was
//! still unanswered at the deadline has seen no holder, and `Timeout` means
//! one was seen (a client must tell an outage from contention).

use std::time::{Duration, Instant};

use crate::backend::deadline::saturating_add;
use crate::backend::transient::is_transient;
use crate::LockError;

/// The first pause after a failure: short, since most failures that pass
/// pass at once (a connection retired and opened anew).
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause: a server that is back is found within this.
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// The failures of one acquisition so far.
#[derive(Debug)]
pub(crate) struct RideThrough {
    /// No second attempt: a zero wait, or a wait without a limit.
    once: bool,
    deadline: Instant,
    pause: Duration,
    failures: u32,
    /// The failure that the last attempt followed, if it did.
    last_failure: Option<LockError>,
}

impl RideThrough {
    /// For an acquisition of one attempt (`once`) or waiting up to
    /// `deadline` (`None`: no limit).
    pub(crate) fn new(once: bool, deadline: Option<Instant>) -> Self {
        RideThrough {
            once: once || deadline.is_none(),
            deadline: deadline.unwrap_or_else(Instant::now),
            pause: FIRST_PAUSE,
            failures: 0,
            last_failure: None,
        }
    }

    /// After `error` of an attempt on `key`: waits the pause before the
    /// next attempt and returns `Ok`, or returns `error` when it does not
    /// pass or the wait is over.
    pub(crate) async fn after(&mut self, key: &str, error: LockError) -> Result<(), LockError> {
        // After `dlock::shutdown` nothing will pass: connections are gone.
        let shut_down = crate::lease::background::check().is_err();
        if self.once || shut_down || !is_transient(&error) {
            return Err(error);
        }
        let pause = self.pause;
        if saturating_add(Instant::now(), pause) >= self.deadline {
            tracing::debug!(key, failures = self.failures + 1, error = %error,
                "the wait is over; the acquisition fails with its last error");
            return Err(error);
        }
        self.failures += 1;
        tracing::debug!(key, failures = self.failures, ?pause, error = %error,
            "an attempt failed on a transient error; asking again within the wait");
        tokio::time::sleep(pause).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        self.last_failure = Some(error);
        Ok(())
    }

    /// An attempt on `key` answered: granted (`true`), or not acquired
    /// within the wait. Not acquired right after failures, at the end of
    /// the wait, is the last failure (see the module docs), else `Ok`.
    pub(crate) fn answered(&mut self, key: &str, granted: bool) -> Result<(), LockError> {
        let failures = std::mem::take(&mut self.failures);
        self.pause = FIRST_PAUSE;
        let last_failure = self.last_failure.take();
        if failures > 0 && granted {
            tracing::info!(
                key,
                failures,
                "dlock: an acquisition rode through transient failures"
            );
        }
        match last_failure {
            Some(e) if !granted && Instant::now() >= self.deadline => Err(e),
            _ => Ok(()),
        }
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
        // A wait with time left: only the kind of error ends it.
        let mut ride = RideThrough::new(false, Some(Instant::now() + Duration::from_secs(5)));
        let refused = LockError::backend("test://", "NOPERM");
        let start = Instant::now();
        assert!(ride.after("k", refused).await.is_err());
        assert!(start.elapsed() < FIRST_PAUSE, "a refusal was waited on");
        assert!(
            ride.after("k", reset()).await.is_ok(),
            "a reset is asked again"
        );
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

    #[tokio::test]
    async fn a_wait_without_limit_is_left_to_the_backend() {
        let mut ride = RideThrough::new(false, None);
        assert!(ride.after("k", reset()).await.is_err());
    }

    #[tokio::test]
    async fn a_wait_that_ends_in_failures_ends_with_the_last_failure() {
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut ride = RideThrough::new(false, Some(deadline));
        ride.after("k", reset()).await.unwrap();
        tokio::time::sleep_until(deadline.into()).await;
        let ended = ride.answered("k", false).unwrap_err();
        assert!(matches!(ended, LockError::Backend { .. }), "{ended:?}");
        // A grant is a grant, and a holder seen before the end is `Timeout`.
        let mut ride = RideThrough::new(false, Some(Instant::now() + Duration::from_secs(5)));
        ride.after("k", reset()).await.unwrap();
        assert!(ride.answered("k", false).is_ok());
        assert!(ride.answered("k", true).is_ok());
    }
}
