//! Deadlines: bounding a wait by an optional deadline, and instants that
//! never overflow whatever duration a caller passes (`Duration::MAX` is a
//! natural way to write "forever").

use std::future::Future;
use std::time::{Duration, Instant};

/// Waits at least this long are no limit: later than any lease or wait can
/// matter, and far enough from the last representable instant that tokio's
/// timer (which rounds deadlines up) never overflows.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Runs `work` until `deadline` (`None`, or a century or more away: no
/// limit). `None` if the deadline came first; `work` is dropped then, so it
/// must be cancel safe.
pub(crate) async fn until<T>(
    deadline: Option<Instant>,
    work: impl Future<Output = T>,
) -> Option<T> {
    match deadline.filter(|d| d.saturating_duration_since(Instant::now()) < FOREVER) {
        Some(d) => tokio::time::timeout_at(d.into(), work).await.ok(),
        None => Some(work.await),
    }
}

/// The deadline of a wait of `wait` from now; `None` (no limit) for a wait
/// of a century or more, `Duration::MAX` included.
pub(crate) fn after(wait: Duration) -> Option<Instant> {
    (wait < FOREVER)
        .then(|| Instant::now().checked_add(wait))
        .flatten()
}

/// `at + span`, or, past the last representable instant, a century from
/// `at`: later than any lease or wait can matter.
pub(crate) fn saturating_add(at: Instant, span: Duration) -> Instant {
    at.checked_add(span.min(FOREVER))
        .or_else(|| at.checked_add(FOREVER))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_do_not_overflow() {
        assert_eq!(after(Duration::MAX), None);
        assert_eq!(after(Duration::from_secs(u64::MAX >> 2)), None);
        assert!(after(Duration::from_secs(1)).is_some());
        let now = Instant::now();
        assert!(saturating_add(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
        assert_eq!(saturating_add(now, Duration::MAX), now + FOREVER);
        assert_eq!(
            saturating_add(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn a_deadline_near_the_last_instant_is_no_limit() {
        // Far enough to pass `checked_add`, close enough to the end for
        // tokio's rounding to overflow, were it handed to the timer.
        let far = Instant::now().checked_add(Duration::from_secs(u64::MAX >> 2));
        assert!(far.is_some());
        assert_eq!(until(far, async { 7 }).await, Some(7));
    }
}
