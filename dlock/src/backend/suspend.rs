//! Time the host spent suspended, so local lease checks count it.
//!
//! A lease's `valid_until` is an [`Instant`]: `CLOCK_MONOTONIC` on Linux,
//! which stops while the host is suspended (laptop lid, `systemctl
//! suspend`). The servers' clocks go on, so after a suspend longer than the
//! ttl another process may hold the key while `valid_until` still lies
//! ahead. `CLOCK_BOOTTIME` counts the suspend: the suspended time so far is
//! boottime elapsed minus monotonic elapsed since a base point.
//!
//! Deadlines stay monotonic instants (the public `Lease::valid_until`
//! keeps its type, and every backend computes it as before); the checks
//! add the time suspended since the lease's request was sent instead
//! ([`lease_now`]). That request is unknown here, but it was sent no earlier
//! than `valid_until - ttl` (a backend's deadline is at most `sent + ttl`),
//! so the suspends counted are those observed after that instant: at least
//! every suspend since the send, a suspend during the request included.
//! Without `CLOCK_BOOTTIME` (not Linux) nothing is counted: plain `Instant`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::backend::deadline::saturating_add;
use crate::backend::Lease;

/// Increases of the suspended time below this are the noise of reading two
/// clocks one after the other, not a suspend: not recorded. Leaving them out
/// errs on the safe side (a lease's start counts the smaller value).
const NOISE: Duration = Duration::from_millis(2);

/// Suspends remembered; a lease older than all of them counts every
/// suspend since the process first looked (later than needed, never
/// earlier).
const REMEMBERED: usize = 64;

static CLOCK: LazyLock<SuspendClock> = LazyLock::new(SuspendClock::system);

/// "Now" for checking `lease`'s `valid_until`: the monotonic now plus the
/// time the host was suspended since the lease's request was sent.
pub(crate) fn lease_now(lease: &Lease) -> Instant {
    CLOCK.lease_now(lease)
}

/// The time the host spent suspended since dlock first looked (zero where
/// it cannot be measured). Also starts the measurement: the core calls it
/// before its first request, so no lease predates the base point.
pub(crate) fn suspended() -> Duration {
    CLOCK.suspended()
}

/// The process's clock (the watchdog's, outside tests).
pub(crate) fn system_clock() -> &'static SuspendClock {
    &CLOCK
}

/// Where the suspended time comes from.
#[derive(Debug)]
enum Source {
    /// `CLOCK_BOOTTIME` against `Instant`, from these readings.
    #[cfg(target_os = "linux")]
    Boottime { mono: Instant, boot: Duration },
    /// Not measurable here: never suspended, as far as dlock can tell.
    #[cfg(not(target_os = "linux"))]
    Unmeasured,
    /// A suspended time set by a test (nanoseconds).
    #[cfg(test)]
    Fake(AtomicU64),
}

/// The suspended time so far, and the suspends seen, with when.
#[derive(Debug)]
pub(crate) struct SuspendClock {
    source: Source,
    /// The last suspended time recorded, in nanoseconds; zero while none
    /// was (the common case: checks then take no lock).
    last: AtomicU64,
    /// `(observed at, suspended time then)`, oldest first: at `observed at`
    /// and later, the suspended time was at least that.
    seen: Mutex<Vec<(Instant, Duration)>>,
    /// How many suspends were seen: a watchdog that saw this many already
    /// need not look at its leases again.
    count: AtomicU64,
}

impl SuspendClock {
    fn system() -> Self {
        #[cfg(target_os = "linux")]
        let source = Source::Boottime {
            mono: Instant::now(),
            boot: boottime(),
        };
        #[cfg(not(target_os = "linux"))]
        let source = Source::Unmeasured;
        Self::with(source)
    }

    fn with(source: Source) -> Self {
        SuspendClock {
            source,
            last: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            count: AtomicU64::new(0),
        }
    }

    /// A clock whose suspended time a test sets with [`Self::fake_suspend`].
    #[cfg(test)]
    pub(crate) fn fake() -> Self {
        Self::with(Source::Fake(AtomicU64::new(0)))
    }

    /// Adds `span` to a fake clock's suspended time (a suspend ends now).
    #[cfg(test)]
    pub(crate) fn fake_suspend(&self, span: Duration) {
        if let Source::Fake(nanos) = &self.source {
            nanos.fetch_add(nanos_of(span), Ordering::SeqCst);
        }
    }

    fn read(&self) -> Duration {
        match &self.source {
            #[cfg(target_os = "linux")]
            Source::Boottime { mono, boot } => {
                // Monotonic first: the boottime read after it is the later
                // one, so the noise is a few nanoseconds more, never less.
                let mono_elapsed = mono.elapsed();
                let boot_elapsed = boottime().saturating_sub(*boot);
                boot_elapsed.saturating_sub(mono_elapsed)
            }
            #[cfg(not(target_os = "linux"))]
            Source::Unmeasured => Duration::ZERO,
            #[cfg(test)]
            Source::Fake(nanos) => Duration::from_nanos(nanos.load(Ordering::SeqCst)),
        }
    }

    /// The suspended time so far; records it if it grew by a suspend.
    pub(crate) fn suspended(&self) -> Duration {
        let now = self.read();
        let last = Duration::from_nanos(self.last.load(Ordering::Acquire));
        if now > last + NOISE {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen.last().is_none_or(|&(_, s)| now > s + NOISE) {
                // Observed after the read: the suspended time at that
                // instant is at least `now` (it never decreases).
                seen.push((Instant::now(), now));
                if seen.len() > REMEMBERED {
                    seen.remove(0);
                }
                self.last.store(nanos_of(now), Ordering::Release);
                self.count.fetch_add(1, Ordering::AcqRel);
            }
        }
        now
    }

    /// How many suspends were seen so far, this reading included.
    pub(crate) fn suspends(&self) -> u64 {
        self.suspended();
        self.count.load(Ordering::Acquire)
    }

    /// A lower bound of the suspended time at `at`: the last one observed
    /// at or before it.
    fn suspended_by(&self, at: Instant) -> Duration {
        if self.last.load(Ordering::Acquire) == 0 {
            return Duration::ZERO;
        }
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .rev()
            .find(|&&(observed, _)| observed <= at)
            .map_or(Duration::ZERO, |&(_, s)| s)
    }

    /// See [`lease_now`].
    pub(crate) fn lease_now(&self, lease: &Lease) -> Instant {
        let now = Instant::now();
        let total = self.suspended();
        // No earlier than the request's send (`valid_until <= sent + ttl`);
        // a ttl reaching before the clock's start counts every suspend.
        let before = lease
            .valid_until
            .checked_sub(lease.ttl)
            .map_or(Duration::ZERO, |sent| self.suspended_by(sent));
        saturating_add(now, total.saturating_sub(before))
    }
}

fn nanos_of(span: Duration) -> u64 {
    u64::try_from(span.as_nanos()).unwrap_or(u64::MAX)
}

/// `CLOCK_BOOTTIME`: monotonic, and counting while the host is suspended.
#[cfg(target_os = "linux")]
fn boottime() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(ttl: Duration) -> Lease {
        let valid_until = crate::backend::lease_deadline(Instant::now(), ttl);
        Lease::unfenced("k", "t", ttl, valid_until, "test".into())
    }

    #[test]
    fn a_suspend_longer_than_the_ttl_ends_the_lease() {
        let clock = SuspendClock::fake();
        let ttl = Duration::from_secs(10);
        let held = lease(ttl);
        assert!(clock.lease_now(&held) < held.valid_until);
        clock.fake_suspend(2 * ttl);
        assert!(clock.lease_now(&held) >= held.valid_until);
    }

    #[test]
    fn a_suspend_before_the_lease_does_not_count() {
        let clock = SuspendClock::fake();
        let ttl = Duration::from_secs(10);
        clock.fake_suspend(2 * ttl);
        assert_eq!(clock.suspended(), 2 * ttl);
        // Observed before this lease's request: not the lease's business.
        // Later than the drift, the margin the lease's start is taken with.
        std::thread::sleep(crate::backend::drift(ttl) + Duration::from_millis(5));
        let held = lease(ttl);
        assert!(clock.lease_now(&held) < held.valid_until);
        // A short suspend afterwards counts, and the lease lives on.
        clock.fake_suspend(Duration::from_secs(1));
        let now = clock.lease_now(&held);
        assert!(now < held.valid_until);
        assert!(now >= Instant::now() + Duration::from_millis(900));
    }

    #[test]
    fn the_real_clock_reads_no_suspend_in_a_test() {
        // The host is not suspended during a test run: noise only.
        assert!(suspended() < Duration::from_secs(1), "{:?}", suspended());
        let held = lease(Duration::from_secs(10));
        assert!(lease_now(&held) < held.valid_until);
    }
}
