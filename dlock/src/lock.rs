//! `Lock`: a key plus options; `acquire` and `try_acquire`.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{AcquireRequest, LockBackend};
use crate::guard::LockGuard;
use crate::lease::{LeaseKind, LeaseShared, NewLease};
use crate::observe::{self, Acquisition, Kind};
use crate::ttl::{DEFAULT_TTL, MAX_TTL, MIN_TTL};
use crate::{deadline, local, registry, scope, LockError};

/// What a granted acquisition shows operators: whether it re-entered, and
/// its fence.
pub(crate) trait Observed {
    fn observed(&self) -> (bool, Option<u64>);
}

impl Observed for LockGuard {
    fn observed(&self) -> (bool, Option<u64>) {
        (self.is_reentrant(), self.fencing_token())
    }
}

/// A distributed lock: a key and the options to take it with.
///
/// Building a `Lock` talks to nobody; [`Lock::acquire`] and
/// [`Lock::try_acquire`] do. A `Lock` is cheap to clone and can be kept in a
/// static or a struct and acquired many times.
///
/// | option | default |
/// |---|---|
/// | [`ttl`](Lock::ttl) | 30 s, renewed every ttl/3 while the guard lives ([`MIN_TTL`]..=[`MAX_TTL`]) |
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
    key: Arc<str>,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) renew: bool,
    backend: BackendChoice,
}

#[derive(Clone)]
enum BackendChoice {
    Default,
    Named(Arc<str>),
    /// The backend, and its scheme: the `backend` label operators see.
    Given(Arc<dyn LockBackend>, Arc<str>),
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match &self.backend {
            BackendChoice::Default => "default".to_owned(),
            BackendChoice::Named(name) => format!("named {name:?}"),
            BackendChoice::Given(b, _) => b.describe(),
        };
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("renew", &self.renew)
            .field("backend", &backend)
            .finish()
    }
}

impl Lock {
    /// A lock on `key` with the default options. The key is checked when
    /// the lock is acquired ([`LockError::InvalidKey`]).
    pub fn new(key: impl Into<String>) -> Self {
        Lock {
            key: Arc::from(key.into()),
            ttl: DEFAULT_TTL,
            wait: None,
            renew: true,
            backend: BackendChoice::Default,
        }
    }

    /// The lease length. With renewal on, the watchdog extends it every
    /// ttl/3, so it bounds how long a crashed holder blocks others; with
    /// renewal off it is a hard limit on the critical section.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`acquire`](Lock::acquire) may wait. `Duration::ZERO` makes
    /// one attempt and fails with [`LockError::Busy`] if the lock is held;
    /// a wait too long to end (`Duration::MAX`) means no limit.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Renewal by the watchdog (on by default). Off: the lease ends after
    /// the ttl whatever the holder is doing, and `lost()` fires then.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Uses the backend registered under `name` in [`registry()`](crate::registry()).
    pub fn backend(mut self, name: impl Into<String>) -> Self {
        self.backend = BackendChoice::Named(Arc::from(name.into()));
        self
    }

    /// Uses this backend, bypassing the registry.
    pub fn with_backend(mut self, backend: Arc<dyn LockBackend>) -> Self {
        let described = backend.describe();
        let scheme = crate::url::scheme(&described).unwrap_or("custom");
        self.backend = BackendChoice::Given(backend, Arc::from(scheme));
        self
    }

    /// The `backend` label of this lock's spans and metrics: the registered
    /// name, or the scheme of a backend given directly (never an address or
    /// a credential).
    pub(crate) fn label(&self) -> Arc<str> {
        match &self.backend {
            BackendChoice::Default => observe::DEFAULT_BACKEND.clone(),
            BackendChoice::Named(name) => name.clone(),
            BackendChoice::Given(_, scheme) => scheme.clone(),
        }
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
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
        let start = Instant::now();
        let once = self.wait == Some(Duration::ZERO);
        let attempt = self.acquire_within(self.wait, Kind::Lock);
        let held = self.watched(Kind::Lock, self.wait, once, attempt).await?;
        held_or_error(held, &self.key, once, start)
    }

    /// One attempt that never waits: `Ok(None)` if someone else holds the lock.
    ///
    /// # Errors
    /// As [`acquire`](Lock::acquire), but never `Busy` or `Timeout`.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        let wait = Some(Duration::ZERO);
        let attempt = self.acquire_within(wait, Kind::Lock);
        self.watched(Kind::Lock, wait, true, attempt).await
    }

    /// Runs `attempt` in a `dlock.acquire` span and records its outcome.
    pub(crate) async fn watched<T>(
        &self,
        kind: Kind,
        wait: Option<Duration>,
        once: bool,
        attempt: impl std::future::Future<Output = Result<Option<T>, LockError>>,
    ) -> Result<Option<T>, LockError>
    where
        T: Observed,
    {
        let watch = Acquisition::start(kind, &self.key, self.label(), self.ttl, wait);
        observe::watched(watch, once, attempt, |held: &T| held.observed()).await
    }

    /// The same options on another key (a segment's key).
    pub(crate) fn with_key(&self, key: String) -> Lock {
        Lock {
            key: Arc::from(key),
            ..self.clone()
        }
    }

    /// The guard of a lease on this key whose critical section the running
    /// code is inside of, if any: a reentrant guard, no round trip.
    pub(crate) fn held_here(&self) -> Result<Option<LockGuard>, LockError> {
        let backend = self.check()?;
        Ok(scope::enclosing(&backend, &self.key).map(LockGuard::reentrant))
    }

    /// Validates the key and ttl and finds the backend.
    pub(crate) fn check(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        crate::key::validate(&self.key)?;
        if self.ttl < MIN_TTL {
            return Err(LockError::invalid_option(format!(
                "ttl {:?} for lock `{}` is shorter than the {MIN_TTL:?} minimum that renewal can keep; use a longer ttl",
                self.ttl, self.key
            )));
        }
        if self.ttl > MAX_TTL {
            return Err(LockError::invalid_option(format!(
                "ttl {:?} for lock `{}` is longer than the maximum of {MAX_TTL:?} (365 days, dlock::MAX_TTL); with renewal on, a 30 s ttl already keeps the lock for as long as the guard lives",
                self.ttl, self.key
            )));
        }
        match &self.backend {
            BackendChoice::Default => registry().default_backend(),
            BackendChoice::Named(name) => registry().get(name),
            BackendChoice::Given(b, _) => Ok(b.clone()),
        }
    }

    /// Takes the lock, waiting up to `wait` (`None`: no limit; zero: one
    /// attempt). `Ok(None)`: not acquired in time.
    pub(crate) async fn acquire_within(
        &self,
        wait: Option<Duration>,
        observed: Kind,
    ) -> Result<Option<LockGuard>, LockError> {
        let backend = self.check()?;
        if let Some(held) = scope::enclosing(&backend, &self.key) {
            return Ok(Some(LockGuard::reentrant(held)));
        }
        let local = local::for_backend(&backend);

        let once = wait == Some(Duration::ZERO);
        let deadline = wait.and_then(deadline::after);
        // Wait our turn among this process's tasks first.
        let Some(turn) = local
            .queue
            .turn(local.queue.slot(&self.key), once, deadline)
            .await
        else {
            return Ok(None);
        };

        let request = AcquireRequest {
            key: self.key.to_string(),
            token: new_token()?,
            ttl: self.ttl,
        };
        let granted = if once {
            backend.try_acquire(&request).await
        } else {
            backend.acquire(&request, deadline).await
        };
        let lease = match granted {
            Ok(Some(lease)) => lease,
            other => return other.map(|_| None),
        };

        let shared = LeaseShared::new(NewLease {
            backend,
            lease,
            renew: self.renew,
            kind: LeaseKind::Lock,
            turn,
            label: self.label(),
            observed,
        });
        local.watchdog.register(&shared);
        Ok(Some(LockGuard::outer(shared, local.watchdog.clone())))
    }
}

/// What `acquire` answers for an attempt's `held`: `None` is
/// [`LockError::Busy`] after a single attempt (`once`), else
/// [`LockError::Timeout`] after waiting since `start`.
pub(crate) fn held_or_error<T>(
    held: Option<T>,
    key: &str,
    once: bool,
    start: Instant,
) -> Result<T, LockError> {
    match held {
        Some(held) => Ok(held),
        None if once => Err(LockError::Busy {
            key: key.to_owned(),
        }),
        None => Err(LockError::Timeout {
            key: key.to_owned(),
            waited: start.elapsed(),
        }),
    }
}

/// 128 random bits from the OS, hex encoded: the owner token.
pub(crate) fn new_token() -> Result<String, LockError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| {
        LockError::backend("os-rng", format!("no randomness for the owner token: {e}"))
    })?;
    // Encoded by hand: a `format!` per byte costs more than the syscall.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut token = String::with_capacity(2 * bytes.len());
    for b in bytes {
        token.push(char::from(HEX[usize::from(b >> 4)]));
        token.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_hex_and_differ() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
