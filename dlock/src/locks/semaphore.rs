//! `Semaphore`: a distributed counting semaphore whose permits are leases,
//! and `Permit`, its guard.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::lease::acquire::{self, take, Observed, Target};
use crate::lease::observe::Kind;
use crate::lease::options::{lease_option_setters, LeaseOptions};
use crate::{LockError, LockGuard};

/// A counting semaphore: at most `permits` holders at once, across every
/// process that uses the same name on the same service.
///
/// Each permit is a lease of its own (Redisson's `RPermitExpirableSemaphore`
/// and Curator's `InterProcessSemaphoreV2` are the models): the watchdog
/// renews it while its [`Permit`] lives, dropping the permit gives it back,
/// and a crashed holder's permit comes back after its ttl.
///
/// - Every user of one semaphore name must give the same number of permits;
///   the service enforces the count each request carries.
/// - Permits are not reentrant: a task that takes two permits holds two
///   (with one permit, the second `acquire` waits for the first).
/// - [`acquire_many(n)`](Self::acquire_many) takes n permits as one
///   [`Permit`] ([`Permit::count`] is n): all at once or none, never a
///   partial hold, so two takers of n cannot deadlock each other. Takers are
///   served in arrival order: a waiting taker of 4 is not overtaken by later
///   takers of 1 (they wait behind it). [`available`](Self::available) reads
///   how many are free. Memory, Redis, etcd and ZooKeeper take several at
///   once; MySQL takes one at a time (n > 1 is [`LockError::InvalidOption`]
///   there), and so do PostgreSQL and files for now.
/// - Inside one process at most `permits` tasks talk to the service at once;
///   the others queue locally.
/// - Backends: memory, Redis, etcd and ZooKeeper. Others (Redlock) fail with
///   [`LockError::InvalidOption`] ("… has no semaphores yet").
///
/// Options: [`ttl`](Self::ttl), [`wait`](Self::wait), [`renew`](Self::renew),
/// [`backend`](Self::backend), [`with_backend`](Self::with_backend), with
/// the defaults of [`Lock`](crate::Lock).
///
/// ```
/// use dlock::Semaphore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let exports = Semaphore::new("exports", 2);
/// let first = exports.acquire().await?;
/// let second = exports.acquire().await?;
/// assert!(exports.try_acquire().await?.is_none()); // both permits are out
/// first.release().await?;
/// assert!(exports.try_acquire().await?.is_some());
/// # drop(second); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    /// The name (as a key) and the lease options.
    options: LeaseOptions,
    permits: usize,
}

impl Semaphore {
    /// The most permits a semaphore may have: a million. More (or zero) is
    /// [`LockError::InvalidOption`] at acquire.
    pub const MAX_PERMITS: usize = 1_000_000;

    /// A semaphore named `name` with `permits` permits and the default
    /// options. Nothing is checked until it is acquired: zero permits is
    /// [`LockError::InvalidOption`] then, a bad name [`LockError::InvalidKey`]
    /// (names follow the rules of lock keys).
    pub fn new(name: impl Into<String>, permits: usize) -> Self {
        Semaphore {
            options: LeaseOptions::new(name.into()),
            permits,
        }
    }

    lease_option_setters! {
        ttl: "The lease length of each permit (see [`Lock::ttl`](crate::Lock::ttl)).",
        wait: "How long [`acquire`](Self::acquire) may wait for a permit.
    `Duration::ZERO`: one attempt, then [`LockError::Busy`].",
        renew: "Renewal of each permit by the watchdog (on by default; see [`Lock::renew`](crate::Lock::renew)).",
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.options.key
    }

    /// How many holders the semaphore admits at once.
    pub fn permits(&self) -> usize {
        self.permits
    }

    /// Takes a permit, waiting up to the configured `wait`: [`acquire_many(1)`](Self::acquire_many).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for zero permits, a bad ttl or a backend
    /// without semaphores; [`LockError::Timeout`] when no permit freed within
    /// the wait; [`LockError::Busy`] when the wait is zero and all permits
    /// are held; [`LockError::InvalidKey`], [`LockError::NoBackend`],
    /// [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves no permit and no queue entry behind (a
    /// permit granted at the very moment of cancellation is released in the
    /// background).
    pub async fn acquire(&self) -> Result<Permit, LockError> {
        self.acquire_many(1).await
    }

    /// One attempt that never waits: `Ok(None)` if all permits are held.
    /// [`try_acquire_many(1)`](Self::try_acquire_many).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), but never `Busy` or `Timeout`.
    pub async fn try_acquire(&self) -> Result<Option<Permit>, LockError> {
        self.try_acquire_many(1).await
    }

    /// Takes `n` permits as one [`Permit`], waiting up to the configured
    /// `wait`: all `n` at once or none (no partial hold while waiting). A
    /// waiter is served in arrival order: later takers, of any count, wait
    /// behind it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let slots = dlock::Semaphore::new("export-slots", 10)
    ///     .with_backend(dlock::connect("memory://").await?);
    /// let big_export = slots.acquire_many(4).await?;
    /// assert_eq!(big_export.count(), 4);
    /// assert_eq!(slots.available().await?, 6);
    /// big_export.release().await?;
    /// assert_eq!(slots.available().await?, 10);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for `n` = 0 or more than the permits
    /// (naming both), or `n` > 1 on a backend that takes one permit at a time
    /// (MySQL); otherwise as [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire): dropping the future leaves no permit
    /// and no place in the queue behind.
    pub async fn acquire_many(&self, n: usize) -> Result<Permit, LockError> {
        acquire::acquire(&self.options, Kind::Permit, |wait| {
            self.acquire_within(n, wait)
        })
        .await
    }

    /// One attempt at `n` permits as one [`Permit`] that never waits:
    /// `Ok(None)` if fewer than `n` are free (or an earlier taker waits for
    /// them), and then nothing is held.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let slots = dlock::Semaphore::new("slots", 3).with_backend(dlock::connect("memory://").await?);
    /// let one = slots.acquire().await?;
    /// assert!(slots.try_acquire_many(3).await?.is_none()); // 2 free: none taken
    /// assert_eq!(slots.available().await?, 2);
    /// # drop(one); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`acquire_many`](Self::acquire_many), but never `Busy` or `Timeout`.
    pub async fn try_acquire_many(&self, n: usize) -> Result<Option<Permit>, LockError> {
        acquire::try_acquire(&self.options, Kind::Permit, |wait| {
            self.acquire_within(n, wait)
        })
        .await
    }

    /// How many permits are free now: the permits minus those held by live
    /// holders (each counted with its [`Permit::count`]); all of them when
    /// nobody holds one. Reads the server once: the answer may be stale by
    /// the time it arrives. The `dlock.operation` span (`op = "available"`)
    /// and `dlock_operations_total`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let slots = dlock::Semaphore::new("slots", 5).with_backend(dlock::connect("memory://").await?);
    /// assert_eq!(slots.available().await?, 5);
    /// let two = slots.acquire_many(2).await?;
    /// assert_eq!(slots.available().await?, 3);
    /// # drop(two); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a bad permit count, a backend
    /// without semaphores or a semaphore stored with another count;
    /// [`LockError::InvalidKey`], [`LockError::NoBackend`],
    /// [`LockError::Backend`].
    pub async fn available(&self) -> Result<usize, LockError> {
        self.check_permits()?;
        let backend = self.options.check()?;
        let described = backend.describe();
        let label = self.options.label();
        crate::lease::observe::operation::operation(
            "available",
            self.name(),
            &label,
            async {
                let Some(semaphores) = backend.permits() else {
                    return Err(crate::backend::no_semaphores(&described));
                };
                semaphores.available(self.name(), self.permits).await
            },
            |free| if *free == 0 { "none" } else { "free" },
        )
        .await
    }

    /// Who holds permits of this semaphore now, how many each, and the
    /// count stored on the server, without taking anything; one read,
    /// maybe stale by the time it arrives. The `dlock.operation` span
    /// (`op = "inspect"`).
    ///
    /// Unlike [`available`](Self::available), a semaphore stored with
    /// another count than this one's is shown, not refused: the
    /// [`permits`](crate::backend::SemaphoreInfo::permits) it shows is the
    /// server's.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::connect("memory://?client_name=export-2").await?;
    /// let slots = dlock::Semaphore::new("exports", 10).with_backend(backend);
    /// assert_eq!(slots.inspect().await?.permits, None); // nobody holds one
    /// let _three = slots.acquire_many(3).await?;
    /// let info = slots.inspect().await?;
    /// assert_eq!((info.permits, info.held(), info.available()), (Some(10), 3, Some(7)));
    /// assert_eq!(info.holders[0].holder.as_deref(), Some("export-2"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a backend without semaphores or one
    /// that cannot read their holders; [`LockError::InvalidKey`],
    /// [`LockError::NoBackend`], [`LockError::Backend`].
    pub async fn inspect(&self) -> Result<crate::backend::SemaphoreInfo, LockError> {
        let backend = self.options.check()?;
        let described = backend.describe();
        let label = self.options.label();
        crate::lease::observe::operation::operation(
            "inspect",
            self.name(),
            &label,
            async {
                let Some(semaphores) = backend.permits() else {
                    return Err(crate::backend::no_semaphores(&described));
                };
                semaphores.inspect_semaphore(self.name()).await
            },
            |info| {
                if info.holders.is_empty() {
                    "free"
                } else {
                    "held"
                }
            },
        )
        .await
    }

    fn check_permits(&self) -> Result<(), LockError> {
        if self.permits == 0 || self.permits > Self::MAX_PERMITS {
            return Err(LockError::invalid_option(format!(
                "semaphore `{}` has {} permits; give it 1..={} (dlock::Semaphore::MAX_PERMITS)",
                self.name(),
                self.permits,
                Self::MAX_PERMITS
            )));
        }
        Ok(())
    }

    async fn acquire_within(
        &self,
        n: usize,
        wait: Option<Duration>,
    ) -> Result<Option<Permit>, LockError> {
        self.check_permits()?;
        if n == 0 || n > self.permits {
            return Err(LockError::invalid_option(format!(
                "acquire_many({n}) on semaphore `{}` of {} permits: take 1..={} permits at once",
                self.name(),
                self.permits,
                self.permits
            )));
        }
        let backend = self.options.check()?;
        // Told before any wait, local or on the server.
        if n > 1 && backend.permits().is_some_and(|s| !s.many_permits()) {
            return Err(crate::backend::no_many_permits(&backend.describe(), n));
        }
        let target = Target::Permit {
            permits: self.permits,
            count: n,
        };
        let taken = take(&self.options, backend, target, wait, Kind::Permit).await?;
        Ok(taken.map(|taken| Permit {
            guard: LockGuard::from(taken),
            count: n,
        }))
    }
}

/// A held permit of a [`Semaphore`]: the lease lives while the permit lives.
///
/// It behaves as a [`LockGuard`]: the watchdog renews it every ttl/3 (unless
/// renewal is off), [`lost`](Self::lost) resolves if the lease is lost,
/// [`release`](Self::release) gives it back now, and dropping it gives it
/// back in the background on the runtime it was acquired on.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://").await?;
/// let permit = dlock::Semaphore::new("exports", 4).with_backend(backend).acquire().await?;
/// assert_eq!(permit.name(), "exports");
/// assert!(permit.is_held());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the permit is given back as soon as it is dropped"]
#[clippy::has_significant_drop]
pub struct Permit {
    /// The lease machinery of locks, on a permit lease.
    guard: LockGuard,
    /// How many of the semaphore's permits this one lease holds.
    count: usize,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("name", &self.name())
            .field("count", &self.count)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl Observed for Permit {
    fn observed(&self) -> (bool, Option<u64>) {
        // A permit's fence is the backend's own business: not shown.
        (false, None)
    }
}

impl Permit {
    /// The lease under the permit (for `ensure`).
    pub(crate) fn lease_guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.guard.key()
    }

    /// How many of the semaphore's permits this `Permit` holds: 1 from
    /// [`Semaphore::acquire`], n from [`Semaphore::acquire_many(n)`](Semaphore::acquire_many).
    /// They are renewed, released and lost together.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let s = dlock::Semaphore::new("s", 4).with_backend(dlock::connect("memory://").await?);
    /// assert_eq!(s.acquire().await?.count(), 1);
    /// assert_eq!(s.acquire_many(3).await?.count(), 3);
    /// # Ok(()) }
    /// ```
    pub fn count(&self) -> usize {
        self.count
    }

    /// The permit's owner token: at least 128 random bits, hex encoded.
    pub fn token(&self) -> &str {
        self.guard.token()
    }

    /// True while the permit is held: not released, not lost, and its local
    /// deadline not passed.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when the permit's lease is lost; never if it is released
    /// first. The future is `'static`, as [`LockGuard::lost`].
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        self.guard.lost()
    }

    /// Gives the permit back now.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] if the permit was lost or had expired;
    /// [`LockError::Backend`] if the service failed (the permit then expires
    /// after its ttl).
    ///
    /// # Cancel safety
    /// If this future is dropped, the permit is still released in the background.
    pub async fn release(self) -> Result<(), LockError> {
        self.guard.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::memory::MemoryBackend;
    use std::sync::Arc;
    use std::time::Instant;

    fn semaphore(name: &str, permits: usize) -> Semaphore {
        Semaphore::new(name, permits).with_backend(Arc::new(MemoryBackend::new()))
    }

    #[test]
    fn permit_is_send_sync() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Permit>();
    }

    #[tokio::test]
    async fn zero_permits_is_an_invalid_option() {
        let s = semaphore("none", 0);
        let err = s.acquire().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        let err = s.try_acquire().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn try_acquire_is_none_at_n_and_busy_with_zero_wait() {
        let s = semaphore("three", 3);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(s.try_acquire().await.unwrap().expect("a free permit"));
        }
        assert!(s.try_acquire().await.unwrap().is_none());
        let err = s.clone().wait(Duration::ZERO).acquire().await.unwrap_err();
        assert!(matches!(err, LockError::Busy { ref key } if key == "three"));
        held.pop().unwrap().release().await.unwrap();
        assert!(s.try_acquire().await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_a_permit_is_released() {
        let s = semaphore("wake", 1);
        let held = s.acquire().await.unwrap();
        let waiter = {
            let s = s.clone().wait(Duration::from_secs(5));
            tokio::spawn(async move { (s.acquire().await, Instant::now()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let (permit, got) = waiter.await.unwrap();
        assert!(permit.unwrap().is_held());
        assert!(got - released < Duration::from_millis(500));
    }

    #[tokio::test]
    async fn renewal_keeps_a_permit_past_its_ttl() {
        let ttl = Duration::from_millis(150);
        let s = semaphore("renewed", 1).ttl(ttl);
        let held = s.acquire().await.unwrap();
        tokio::time::sleep(ttl * 3).await;
        assert!(held.is_held(), "the watchdog let the permit lapse");
        assert!(s.try_acquire().await.unwrap().is_none());
        held.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_backend_without_semaphores_says_so() {
        let backend = Arc::new(crate::locks_only::LocksOnly::default());
        let s = Semaphore::new("exports", 2).with_backend(backend);
        for err in [
            s.acquire().await.unwrap_err(),
            s.try_acquire().await.unwrap_err(),
        ] {
            assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
            assert!(
                err.to_string()
                    .contains("locks-only:// backend has no semaphores yet"),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn wait_times_out() {
        let s = semaphore("timeout", 1);
        let _held = s.acquire().await.unwrap();
        let err = s
            .clone()
            .wait(Duration::from_millis(80))
            .acquire()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    }
}
