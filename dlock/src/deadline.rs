//! Deadlines: bounding a wait by an optional deadline, and instants that
//! never overflow whatever duration a caller passes (`Duration::MAX` is a
//! natural way to write "forever").

use std::future::Future;
use std::time::{Duration, Instant};

/// Runs `work` until `deadline` (`None`: no limit). `None` if the deadline
/// came first; `work` is dropped then, so it must be cancel safe.
pub(crate) async fn until<T>(
    deadline: Option<Instant>,
    work: impl Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), work).await.ok(),
        None => Some(work.await),
    }
}

/// The deadline of a wait of `wait` from now; `None` (no limit) for a wait
/// too long to be an instant.
pub(crate) fn after(wait: Duration) -> Option<Instant> {
    Instant::now().checked_add(wait)
}

/// `at + span`, or, past the last representable instant, a century from
/// `at`: later than any lease or wait can matter.
pub(crate) fn saturating_add(at: Instant, span: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    at.checked_add(span)
        .or_else(|| at.checked_add(CENTURY))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_do_not_overflow() {
        assert_eq!(after(Duration::MAX), None);
        assert!(after(Duration::from_secs(1)).is_some());
        let now = Instant::now();
        assert!(saturating_add(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
        assert_eq!(
            saturating_add(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }
}
