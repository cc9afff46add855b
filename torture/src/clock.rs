//! The one clock of a run: `CLOCK_MONOTONIC` in nanoseconds, shared by every process on the
//! host, so the workers', the store's and the nemesis's timestamps compare directly.

use nix::time::{clock_gettime, ClockId};

/// Nanoseconds on `CLOCK_MONOTONIC` (system-wide on Linux; never steps back).
///
/// ```
/// let a = dlock_torture::clock::now_ns();
/// let b = dlock_torture::clock::now_ns();
/// assert!(b >= a);
/// ```
pub fn now_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux; 0 would only make a figure look odd, never panic.
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
                + u64::try_from(t.tv_nsec()).unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Nanoseconds to milliseconds, for printing.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}
