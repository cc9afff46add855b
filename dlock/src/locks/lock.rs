//! `Lock`: a key plus options; `acquire` and `try_acquire`.

use std::fmt;

use crate::lease::acquire;
use crate::lease::observe::Kind;
use crate::lease::options::{hold_at_least_setter, lease_option_setters, LeaseOptions};
use crate::locks::guard::LockGuard;
use crate::locks::within::lock_within;
use crate::LockError;

/// A distributed lock: a key and the options to take it with.
///
/// Building a `Lock` talks to nobody; [`Lock::acquire`] and
/// [`Lock::try_acquire`] do. A `Lock` is cheap to clone and can be kept in a
/// static or a struct and acquired many times.
///
/// | option | default |
/// |---|---|
/// | [`ttl`](Lock::ttl) | 30 s, renewed every ttl/3 while the guard lives ([`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL)) |
/// | [`wait`](Lock::wait) | no limit (`Duration::ZERO`: one attempt; `Duration::MAX`: no limit) |
/// | [`renew`](Lock::renew) | on |
/// | [`backend`](Lock::backend) | the registry's default |
///
/// ```
/// use dlock::Lock;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let lock = Lock::new("order:42").ttl(Duration::from_secs(10)).wait(Duration::from_secs(5));
/// let guard = lock.acquire().await?;            // waits up to 5 s
/// assert!(lock.try_acquire().await?.is_none());   // held: a second acquire waits
/// let inner = guard.scope(lock.try_acquire()).await?; // inside the guard's scope: reentrant
/// assert!(inner.is_some_and(|g| g.is_reentrant()));
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    options: LeaseOptions,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.options.fmt(f)
    }
}

impl Lock {
    /// A lock on `key` with the default options. The key is checked when
    /// the lock is acquired ([`LockError::InvalidKey`]).
    pub fn new(key: impl Into<String>) -> Self {
        Lock {
            options: LeaseOptions::new(key.into()),
        }
    }

    lease_option_setters! {
        ttl: "The lease length. With renewal on, the watchdog extends it every
ttl/3, so it bounds how long a crashed holder blocks others; with
renewal off it is a hard limit on the critical section.",
        wait: "How long [`acquire`](Lock::acquire) may wait. `Duration::ZERO` makes
one attempt and fails with [`LockError::Busy`] if the lock is held;
a wait too long to end (`Duration::MAX`) means no limit.",
        renew: "Renewal by the watchdog (on by default). Off: the lease ends after
    the ttl whatever the holder is doing, and `lost()` fires then.",
    }

    hold_at_least_setter!(
        type: "Lock",
        new: r#"Lock::new("report:nightly")"#,
        then: r#"let guard = lock.acquire().await?;
// ... the report, in less than 50 s ...
guard.release().await?;
assert!(lock.try_acquire().await?.is_none(), "still taken for this tick");
"#
    );

    /// The options, for the operations of other modules.
    pub(crate) fn options(&self) -> &LeaseOptions {
        &self.options
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.options.key
    }

    /// Takes the lock, waiting up to the configured `wait`.
    ///
    /// Inside the critical section of a guard that holds this key on this
    /// backend ([`LockGuard::scope`], a `#[distributed_lock]` body), the key
    /// is granted at once, without a round trip (reentrancy). Everywhere
    /// else a held key is waited for, by other tasks and by the holder's own
    /// code alike. Waiters of this process queue locally, so only one of
    /// them talks to the service.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out, [`LockError::Busy`] when
    /// the wait is zero and the lock is held, [`LockError::InvalidKey`],
    /// [`LockError::InvalidOption`], [`LockError::NoBackend`], and
    /// [`LockError::Backend`] when the service fails.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind: no local queue entry, no
    /// server-side queue entry, no lease (a lease granted at the very moment of
    /// cancellation is released in the background).
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        acquire::acquire(&self.options, Kind::Lock, |wait| {
            lock_within(&self.options, wait, Kind::Lock)
        })
        .await
    }

    /// One attempt that never waits: `Ok(None)` if someone else holds the lock.
    ///
    /// # Errors
    /// As [`acquire`](Lock::acquire), but never `Busy` or `Timeout`.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        acquire::try_acquire(&self.options, Kind::Lock, |wait| {
            lock_within(&self.options, wait, Kind::Lock)
        })
        .await
    }
}
