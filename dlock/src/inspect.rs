//! Operating a lock: who holds a key ([`LockInfo`], [`Lock::inspect`]), an
//! operator's release ([`Lock::force_release`]), a guard's time left and its
//! extension ([`LockGuard::remaining`], [`LockGuard::extend`]), and the
//! holder's identity that every lock lease carries.
//!
//! # The holder's identity
//!
//! A lock's owner token is `<32 hex digits>@<client name>`: the random part
//! is the capability to renew and release, the client name (default
//! `hostname:pid`, set with `?client_name=` on the backend's URL) is what
//! [`LockInfo::holder`] shows. Every backend already stores the owner token
//! with the lease (the Redis value, the ZooKeeper node's data), so the
//! identity needs no extra key and no change to the protocol other clients
//! see; etcd, which stores no token, writes the client name as the key's
//! value. [`holder_of`] reads the name back and never returns the random
//! part; a value written by another client (redis-py, Curator) has no name.
//!
//! These items are the contract's vocabulary, shared with every backend:
//! they are defined in `backend/holder.rs` and re-exported here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::LockBackend;
use crate::lease::held::{renew_on, Status};
use crate::lease::observe::operation::operation;
use crate::locks::guard::LockGuard;
use crate::locks::lock::Lock;
use crate::LockError;

pub use crate::backend::holder::{
    check_client_name, default_client_name, holder_of, not_supported, too_many_to_list, LockInfo,
    Waiting, MAX_CLIENT_NAME, MAX_LISTED,
};
pub use crate::backend::{PermitHolder, SemaphoreInfo};

/// The lock keys held now on `backend` that start with `prefix` (every key
/// for `""`), each with what [`Lock::inspect`] shows, sorted by key.
///
/// - Only plain locks (and a [`SegmentedLock`](crate::SegmentedLock)'s
///   segments, which are locks): not semaphores or read-write locks.
/// - What each backend reads: memory its table; a Redis server, Sentinel
///   master or every Cluster master `SCAN`s (Redlock: every master, a key
///   listed when a quorum holds it for one holder, as `inspect` says); etcd a
///   range read of the prefix; ZooKeeper the children of its prefix node.
///   Each key found is then inspected, so the answer is a series of reads,
///   not one snapshot: a key taken or freed meanwhile may be missing or
///   extra.
/// - At most [`MAX_LISTED`] keys; more is an error (narrow the prefix).
/// - The `dlock.operation` span (`op = "list"`, `key` = the prefix) and
///   `dlock_operations_total`.
///
/// # Errors
/// [`LockError::InvalidKey`] for a prefix no key starts with (a control
/// character, longer than [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES));
/// [`LockError::InvalidOption`] past [`MAX_LISTED`] keys, or on a backend
/// that cannot list (one from outside this crate);
/// [`LockError::Backend`] when the service fails.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://?client_name=cron-3").await?;
/// let _a = dlock::Lock::new("report:daily").with_backend(backend.clone()).acquire().await?;
/// let _b = dlock::Lock::new("invoice:9").with_backend(backend.clone()).acquire().await?;
/// let held = dlock::list_locks(&*backend, "report:").await?;
/// assert_eq!(held.len(), 1);
/// assert_eq!(held[0].0, "report:daily");
/// assert_eq!(held[0].1.holder.as_deref(), Some("cron-3"));
/// # Ok(()) }
/// ```
pub async fn list_locks(
    backend: &dyn LockBackend,
    prefix: &str,
) -> Result<Vec<(String, LockInfo)>, LockError> {
    let described = listing(backend, prefix)?;
    let label = crate::url::scheme(&described).unwrap_or("custom");
    operation(
        "list",
        prefix,
        label,
        async {
            let mut held = backend.list(prefix).await?;
            if held.len() > MAX_LISTED {
                return Err(too_many_to_list(&described, prefix));
            }
            held.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(held)
        },
        |held| if held.is_empty() { "none" } else { "listed" },
    )
    .await
}

/// The semaphores on `backend` whose names start with `prefix` (every one
/// for `""`) that have holders now, each with what
/// [`Semaphore::inspect`](crate::Semaphore::inspect) shows, sorted by name.
///
/// - What each backend reads: memory its table; Redis `SCAN`s for the
///   semaphores' sets (every master of a Cluster); etcd a range read of
///   its semaphores' root; ZooKeeper the children of it; MySQL the count
///   rows of its table; files the count files of its directory.
///   PostgreSQL keys a semaphore by a hash of its name, so it cannot list
///   them: an [`InvalidOption`](LockError::InvalidOption) saying to inspect
///   one by name.
/// - Each name found is then inspected: a series of reads, not one
///   snapshot. At most [`MAX_LISTED`] semaphores; more is an error.
/// - The `dlock.operation` span (`op = "list_semaphores"`, `key` = the
///   prefix) and `dlock_operations_total`.
///
/// # Errors
/// As [`list_locks`], and [`LockError::InvalidOption`] on a backend
/// without semaphores or one that cannot list them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://?client_name=export-2").await?;
/// let slots = dlock::Semaphore::new("exports", 10).with_backend(backend.clone());
/// let _four = slots.acquire_many(4).await?;
/// let found = dlock::list_semaphores(&*backend, "exp").await?;
/// assert_eq!(found.len(), 1);
/// let (name, info) = &found[0];
/// assert_eq!((name.as_str(), info.available()), ("exports", Some(6)));
/// assert_eq!(info.holders[0].holder.as_deref(), Some("export-2"));
/// # Ok(()) }
/// ```
pub async fn list_semaphores(
    backend: &dyn LockBackend,
    prefix: &str,
) -> Result<Vec<(String, SemaphoreInfo)>, LockError> {
    let described = listing(backend, prefix)?;
    let label = crate::url::scheme(&described).unwrap_or("custom");
    operation(
        "list_semaphores",
        prefix,
        label,
        async {
            let Some(semaphores) = backend.permits() else {
                return Err(crate::backend::no_semaphores(&described));
            };
            let mut names = semaphores.semaphore_names(prefix).await?;
            names.sort();
            names.dedup();
            if names.len() > MAX_LISTED {
                return Err(too_many_to_list(&described, prefix));
            }
            let mut found = Vec::with_capacity(names.len());
            for name in names {
                let info = semaphores.inspect_semaphore(&name).await?;
                if !info.holders.is_empty() {
                    found.push((name, info));
                }
            }
            Ok(found)
        },
        |found| if found.is_empty() { "none" } else { "listed" },
    )
    .await
}

/// A listing's checks (not after `shutdown`, a prefix some key may start
/// with), and the backend's described URL, whose scheme labels its span.
fn listing(backend: &dyn LockBackend, prefix: &str) -> Result<String, LockError> {
    crate::lease::background::check()?;
    if !prefix.is_empty() {
        crate::backend::key::validate(prefix)?;
    }
    Ok(backend.describe())
}

impl Lock {
    /// Who holds the key now, without taking it: `None` when it is free.
    ///
    /// Reads the server once; the answer may be stale by the time it
    /// arrives. The `dlock.operation` span (`op = "inspect"`).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], [`LockError::NoBackend`],
    /// [`LockError::Backend`] when the service fails.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let lock = dlock::Lock::new("report").with_backend(dlock::connect("memory://").await?);
    /// let _guard = lock.acquire().await?;
    /// let info = lock.inspect().await?.expect("held");
    /// assert_eq!(info.holder.as_deref(), Some(dlock::default_client_name()));
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self) -> Result<Option<LockInfo>, LockError> {
        let options = self.options();
        let backend = options.check()?;
        let label = options.label();
        operation(
            "inspect",
            &options.key,
            &label,
            backend.inspect(&options.key),
            |i| {
                if i.is_some() {
                    "held"
                } else {
                    "free"
                }
            },
        )
        .await
    }

    /// Frees the key whoever holds it, as an operator would: `true` if a
    /// lease was removed.
    ///
    /// The evicted holder's guard reports the loss ([`LockGuard::lost`]) at
    /// its next renewal; the next holder's fencing token is greater than
    /// the evicted one's, so fenced writes of the old holder are refused.
    /// Waiters are woken. The `dlock.operation` span (`op =
    /// "force_release"`).
    ///
    /// # Errors
    /// As [`inspect`](Lock::inspect).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let lock = dlock::Lock::new("stuck").with_backend(dlock::connect("memory://").await?);
    /// let stuck = lock.acquire().await?;
    /// assert!(lock.force_release().await?);
    /// let next = lock.acquire().await?;
    /// assert!(next.fencing_token() > stuck.fencing_token());
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self) -> Result<bool, LockError> {
        let options = self.options();
        let backend = options.check()?;
        let label = options.label();
        operation(
            "force_release",
            &options.key,
            &label,
            backend.force_release(&options.key),
            |freed| if *freed { "released" } else { "free" },
        )
        .await
    }
}

impl LockGuard {
    /// Time left to the lease's local deadline (zero once it is released,
    /// lost or past it): the least the server still keeps it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let ttl = std::time::Duration::from_secs(10);
    /// let guard = dlock::Lock::new("job").ttl(ttl).with_backend(dlock::connect("memory://").await?).acquire().await?;
    /// assert!(guard.remaining() <= ttl && guard.remaining() > ttl / 2);
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Duration {
        if !self.is_held() {
            return Duration::ZERO;
        }
        let state = self.lease().lock_state();
        state
            .lease
            .valid_until
            .saturating_duration_since(Instant::now())
    }

    /// Renews the lease now with a new `ttl`; the watchdog (if renewal is
    /// on) keeps renewing it with that ttl afterwards. The way to lengthen a
    /// lease taken with `renew(false)`.
    ///
    /// Backends whose lease is a session's (etcd, ZooKeeper) renew the
    /// session: the lease then lasts at most the session's own ttl from now.
    /// The `dlock.operation` span (`op = "extend"`).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a ttl outside
    /// [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL);
    /// [`LockError::NotHeld`] if the lease was released, lost, or the server
    /// refused the renewal (it is then marked lost); [`LockError::Backend`]
    /// when the service fails (the lease is unchanged).
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let lock = dlock::Lock::new("import").ttl(Duration::from_secs(5)).renew(false);
    /// let guard = lock.with_backend(dlock::connect("memory://").await?).acquire().await?;
    /// guard.extend(Duration::from_secs(60)).await?;
    /// assert!(guard.remaining() > Duration::from_secs(30));
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        let shared = self.lease().clone();
        crate::lease::background::check()?;
        if !(crate::MIN_TTL..=crate::MAX_TTL).contains(&ttl) {
            return Err(LockError::invalid_option(format!(
                "ttl {ttl:?} for extending lock `{}` is outside {:?}..={:?}",
                shared.key,
                crate::MIN_TTL,
                crate::MAX_TTL
            )));
        }
        let label = shared.label().clone();
        let key = shared.key.clone();
        operation("extend", &key, &label, extend(shared, ttl), |_| "extended").await
    }
}

async fn extend(
    shared: Arc<crate::lease::held::LeaseShared>,
    ttl: Duration,
) -> Result<(), LockError> {
    let not_held = || LockError::NotHeld {
        key: shared.key.clone(),
    };
    let mut lease = {
        let state = shared.lock_state();
        let now = crate::backend::suspend::lease_now(&state.lease);
        if state.status != Status::Held || now >= state.lease.valid_until {
            return Err(not_held());
        }
        state.lease.clone()
    };
    lease.ttl = ttl;
    let sent = Instant::now();
    let answer = renew_on(&*shared.backend, shared.kind, std::slice::from_ref(&lease))
        .await
        .pop()
        .unwrap_or_else(|| Err(not_held()))?;
    match answer {
        crate::backend::Renewal::Renewed { valid_until } => {
            let mut state = shared.lock_state();
            if state.status != Status::Held {
                return Err(not_held());
            }
            state.lease.ttl = ttl;
            state.lease.valid_until = valid_until;
            state.next_renew = crate::backend::deadline::saturating_add(sent, ttl / 3);
            drop(state);
            // The watchdog keeps leases in time order: a shorter ttl moves
            // them earlier.
            crate::lease::local::for_backend(&shared.backend)
                .watchdog
                .register(&shared);
            Ok(())
        }
        _ => {
            shared.mark_lost(crate::lease::observe::LossReason::Refused);
            Err(not_held())
        }
    }
}
