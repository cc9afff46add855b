//! When a backend sweeps its idle fence rows (`?fence_retention=`): at
//! connect, then at most once per the retention or a minute, whichever is
//! shorter. The sweep itself, a bounded `DELETE`, is the backend's.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest pause between two sweeps of one backend, and the bound on
/// one sweep's statement.
pub(crate) const LONGEST_PAUSE: Duration = Duration::from_secs(60);

/// When a backend sweeps next.
#[derive(Debug)]
pub(crate) struct SweepSchedule {
    /// The pause between two sweeps: the retention, at most a minute.
    every: Duration,
    next: Mutex<Instant>,
}

impl SweepSchedule {
    /// A schedule whose first sweep is due at once.
    pub(crate) fn new(retention: Duration) -> Self {
        SweepSchedule {
            every: retention.min(LONGEST_PAUSE),
            next: Mutex::new(Instant::now()),
        }
    }

    /// Whether a sweep is due now; if it is, the next is due a pause from now
    /// (so two releases at once send one sweep).
    pub(crate) fn due(&self) -> bool {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if now < *next {
            return false;
        }
        *next = now + self.every;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sweep_per_pause() {
        let schedule = SweepSchedule::new(Duration::from_secs(3600));
        assert!(schedule.due(), "the first sweep is due at connect");
        assert!(!schedule.due(), "the next waits a pause");
        assert_eq!(schedule.every, LONGEST_PAUSE, "at most a minute apart");
    }

    #[test]
    fn a_short_retention_sweeps_as_often() {
        let schedule = SweepSchedule::new(Duration::from_millis(20));
        assert!(schedule.due());
        std::thread::sleep(Duration::from_millis(30));
        assert!(schedule.due());
    }
}
