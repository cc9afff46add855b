//! Detects two holders inside one critical section at once.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts holders inside a critical section; any count above one is an
/// overlap. Call [`enter`](Self::enter) right after acquiring and
/// [`leave`](Self::leave) right before releasing.
///
/// ```
/// use dlock_tests::overlap::OverlapDetector;
///
/// let detector = OverlapDetector::default();
/// detector.enter();
/// detector.enter(); // a second holder while the first is inside
/// detector.leave();
/// detector.leave();
/// assert_eq!(detector.overlaps(), 1);
/// ```
#[derive(Debug, Default)]
pub struct OverlapDetector {
    inside: AtomicUsize,
    overlaps: AtomicUsize,
}

impl OverlapDetector {
    /// A holder entered the critical section.
    pub fn enter(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A holder is about to leave the critical section.
    pub fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// How many times a holder entered while another was inside.
    pub fn overlaps(&self) -> usize {
        self.overlaps.load(Ordering::SeqCst)
    }
}
