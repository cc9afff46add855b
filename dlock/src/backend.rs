//! The seam between the core and a coordination service: [`LockBackend`] and
//! the small values that cross it, and the capabilities some backends add
//! (semaphores, read-write locks).

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::LockError;

mod all_keys;
pub use all_keys::{AllKeysBackend, AllOrNone};

/// What the core asks a backend to take: a key, the owner token and the lease length.
#[derive(Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The validated lock key, before the backend maps it into its namespace.
    pub key: String,
    /// The owner token (≥ 128 random bits, hex). Only this token may renew or release.
    pub token: String,
    /// The lease length the server should enforce.
    pub ttl: Duration,
}

impl fmt::Debug for AcquireRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireRequest")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// What the core asks a backend to take: one permit of a counting semaphore.
///
/// A permit is held under its own token and leased on its own, so a crashed
/// holder's permit comes back after its ttl.
#[derive(Clone, PartialEq, Eq)]
pub struct PermitRequest {
    /// The validated semaphore name, before the backend maps it into its namespace.
    pub name: String,
    /// How many holders the semaphore admits at once (at least 1). Every
    /// user of one semaphore must give the same number.
    pub permits: usize,
    /// The permit's owner token (≥ 128 random bits, hex). Only this token may
    /// renew or release the permit.
    pub token: String,
    /// The lease length the server should enforce.
    pub ttl: Duration,
}

impl fmt::Debug for PermitRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitRequest")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// The error of a backend that has no semaphores: what
/// [`Semaphore`](crate::Semaphore) answers when
/// [`LockBackend::permits`] is `None`. It names the backend
/// (`backend` is its [`describe`](LockBackend::describe) text) and the
/// backends that have semaphores.
///
/// ```
/// let e = dlock::backend::no_semaphores("zk://127.0.0.1:2181");
/// assert!(matches!(e, dlock::LockError::InvalidOption { .. }));
/// ```
pub fn no_semaphores(backend: &str) -> LockError {
    LockError::invalid_option(format!(
        "the {backend} backend has no semaphores yet; use a {} backend for `Semaphore`",
        crate::schemes::with_semaphores_listed()
    ))
}

/// Which side of a read-write lock a lease is on.
///
/// ```
/// use dlock::backend::RwMode;
/// assert_eq!(RwMode::Read.as_str(), "read");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// A shared lease: any number of readers hold the key at once.
    Read,
    /// An exclusive lease: one writer, and no reader.
    Write,
}

impl RwMode {
    /// `"read"` or `"write"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
        }
    }
}

/// What the core asks a backend to take: a read or a write lease on a
/// read-write lock.
///
/// A read-write lock on a key is an object of its own on the server, apart
/// from a plain lock of the same key (its layout differs).
#[derive(Clone, PartialEq, Eq)]
pub struct RwRequest {
    /// The validated lock key, before the backend maps it into its namespace.
    pub key: String,
    /// Read (shared) or write (exclusive).
    pub mode: RwMode,
    /// The lease's owner token (≥ 128 random bits, hex). Only this token may
    /// renew or release it.
    pub token: String,
    /// The lease length the server should enforce.
    pub ttl: Duration,
}

impl fmt::Debug for RwRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwRequest")
            .field("key", &self.key)
            .field("mode", &self.mode)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// The error of a backend that has no read-write locks: what
/// [`RwLock`](crate::RwLock) answers when [`LockBackend::rw`] is `None`.
/// It names the backend (`backend` is its
/// [`describe`](LockBackend::describe) text) and the backends that have
/// read-write locks.
///
/// ```
/// let e = dlock::backend::no_rw_locks("zk://127.0.0.1:2181");
/// assert!(matches!(e, dlock::LockError::InvalidOption { .. }));
/// assert!(e.to_string().contains("memory://"));
/// ```
pub fn no_rw_locks(backend: &str) -> LockError {
    LockError::invalid_option(format!(
        "the {backend} backend has no read-write locks; use a {} backend for `RwLock`",
        crate::schemes::with_rw_locks_listed()
    ))
}

/// A lease granted by a backend.
///
/// `valid_until` is the *local* deadline: the instant the request that took or
/// last renewed the lease was sent, plus the ttl, minus a drift margin (see
/// [`lease_deadline`]). The server cannot expire the lease before it, so the
/// core treats the lease as lost no later than that instant.
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lock key as the caller gave it.
    pub key: String,
    /// The owner token from the [`AcquireRequest`].
    pub token: String,
    /// The lease length.
    pub ttl: Duration,
    /// Strictly increasing per key across successive holders, if the backend can promise that.
    pub fencing_token: Option<u64>,
    /// The local deadline of the lease.
    pub valid_until: Instant,
    /// The backend's own name for what it holds (the Redis key, the etcd key,
    /// the ZooKeeper node path): what `release` and `renew` act on, and what an
    /// operator looks for on the server.
    pub resource: String,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("fencing_token", &self.fencing_token)
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

/// The answer of a backend to one renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended; its new local deadline.
    Renewed {
        /// The new local deadline, computed from when the renewal was sent.
        valid_until: Instant,
    },
    /// The server says the lease is no longer ours: it is lost.
    Refused,
    /// The lease's key is gone from the server (deleted behind the holder's
    /// back, as an operator's `DEL` does): it is lost. A backend that can
    /// tell this apart from [`Refused`](Renewal::Refused) says so, for the
    /// `reason` of the loss that operators see.
    Deleted,
    /// The session that carried the lease (an etcd lease, a ZooKeeper
    /// session) has ended: it is lost.
    SessionExpired,
}

impl Renewal {
    /// Whether the lease is lost (any answer but `Renewed`).
    pub fn is_lost(&self) -> bool {
        !matches!(self, Renewal::Renewed { .. })
    }
}

/// The drift margin taken off every lease: 1 % of the ttl plus 2 ms (Redlock's
/// value), covering clock-rate differences between client and server.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The local deadline of a lease whose request was sent at `sent`:
/// `sent + ttl − drift(ttl)`.
///
/// The server starts its timer when it *receives* the request, which is after
/// `sent`, so this deadline is never later than the server's expiry.
///
/// ```
/// use std::time::{Duration, Instant};
/// let sent = Instant::now();
/// let deadline = dlock::backend::lease_deadline(sent, Duration::from_secs(10));
/// assert_eq!(deadline - sent, Duration::from_millis(9_898));
/// ```
///
/// A ttl too long to be an instant gives a deadline a century away: it
/// never panics.
pub fn lease_deadline(sent: Instant, ttl: Duration) -> Instant {
    crate::deadline::saturating_add(sent, ttl.saturating_sub(drift(ttl)))
}

/// A coordination service that can hold leases on keys.
///
/// The core (`Lock`, `LockGuard`, the watchdog, the local wait queue) is
/// written against this trait alone. A backend implements four operations; the
/// core adds reentrancy, local queueing of waiters of one process, batched
/// renewal, lost-lease detection and release on drop.
///
/// # How the backends fit
///
/// - **memory**: a map of key → holder with a server-side deadline. `acquire`
///   waits on an in-process notify (FIFO tickets), with a timer at the
///   holder's deadline.
/// - **redis**: `try_acquire` is one Lua script (`SET NX PX` and the next fence).
///   `acquire` subscribes to the key's release channel on the backend's shared
///   pub/sub connection, then loops: try; on failure wait for a release
///   message or the holder's remaining `PTTL` (expiry publishes nothing),
///   whichever is first, with jitter. No fixed-interval poll.
///   `renew` is one pipeline of compare-and-`PEXPIRE` scripts.
/// - **etcd**: `acquire` puts `<prefix>/<key>/<lease-hex>` under a lease,
///   then, if an older key exists, watches only its predecessor's delete. The
///   queue entry lives on the server while waiting, so `acquire` (not the
///   core) owns the waiting, and must delete its entry when it times out or is
///   dropped. `renew` is a lease keep-alive.
/// - **zookeeper**: like etcd with an ephemeral sequential node; `renew`
///   reports the session's state (the session heartbeat is the renewal).
///
/// # Semaphores
///
/// A backend that has semaphores implements [`PermitBackend`] too and
/// returns itself from [`permits`](LockBackend::permits); one that has none
/// keeps the default (`None`), and [`Semaphore`](crate::Semaphore) fails on
/// it with one [`LockError::InvalidOption`] ([`no_semaphores`]). Its lock
/// protocol is untouched either way. Read-write locks are offered the same
/// way: [`RwBackend`] through [`rw`](LockBackend::rw), else
/// [`no_rw_locks`].
///
/// # Contract
///
/// - `acquire` must be cancel safe: if its future is dropped, nothing it
///   created may be left on the server except what expires by itself with the
///   ttl; etcd and ZooKeeper remove their queue entry in the background.
/// - Transport failures are [`LockError::Backend`], never "not acquired".
/// - Every returned [`Lease::valid_until`] comes from [`lease_deadline`] (or a
///   stricter rule, as Redlock's validity) on the instant the request was sent.
/// - The core lets the next local waiter for the key start its `acquire` as
///   soon as the `release` future has been polled once, not when it is done.
///   A backend that sends a process's requests in order should therefore
///   put the release on the wire (or in its send queue) in that first poll:
///   then the waiter's acquire reaches the server behind it, and a local
///   hand-off costs one round trip. One that does not stays correct (the
///   waiter finds the key held and waits for the release), only slower.
///
/// # Example: a backend that wraps another (here, one that counts acquisitions)
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
/// use std::time::Instant;
/// use dlock::backend::{AcquireRequest, Lease, LockBackend, Renewal};
/// use dlock::{Lock, LockError};
///
/// #[derive(Debug)]
/// struct Counting { inner: Arc<dyn LockBackend>, taken: AtomicUsize }
///
/// #[dlock::async_trait]
/// impl LockBackend for Counting {
///     fn describe(&self) -> String { format!("counting({})", self.inner.describe()) }
///     async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
///         let lease = self.inner.try_acquire(req).await?;
///         if lease.is_some() { self.taken.fetch_add(1, Ordering::Relaxed); }
///         Ok(lease)
///     }
///     async fn acquire(&self, req: &AcquireRequest, deadline: Option<Instant>)
///         -> Result<Option<Lease>, LockError> {
///         let lease = self.inner.acquire(req, deadline).await?;
///         if lease.is_some() { self.taken.fetch_add(1, Ordering::Relaxed); }
///         Ok(lease)
///     }
///     async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
///         self.inner.renew(leases).await
///     }
///     async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
///         self.inner.release(lease).await
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let counting = Arc::new(Counting { inner: dlock::connect("memory://").await.unwrap(), taken: AtomicUsize::new(0) });
/// let guard = Lock::new("job").with_backend(counting.clone()).acquire().await.unwrap();
/// guard.release().await.unwrap();
/// assert_eq!(counting.taken.load(Ordering::Relaxed), 1);
/// # }
/// ```
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// The backend's kind and address for errors and logs, e.g.
    /// `redis://127.0.0.1:6379`, with any credentials redacted.
    fn describe(&self) -> String;

    /// One attempt to take the lease; never waits for a holder.
    ///
    /// `Ok(None)` means another owner holds the key.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError>;

    /// Takes the lease, waiting until it is free or until `deadline`
    /// (`None`: no limit). `Ok(None)` means the deadline passed.
    ///
    /// Waiting is woken by the service (notification, watch), with a timer
    /// for expiry that nobody announces. Must be cancel safe (see the trait docs).
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError>;

    /// Extends every lease in `leases` by its ttl, in as few round trips as
    /// the service allows (one pipeline, one keep-alive). Returns one answer
    /// per lease, in order. An `Err` means "unknown, try again"; the core marks
    /// the lease lost when its local deadline passes without a renewal.
    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>>;

    /// Gives the lease back if it is still ours (compare-and-delete) and wakes
    /// waiters. `Ok(false)` means it was no longer ours (expired or taken).
    async fn release(&self, lease: &Lease) -> Result<bool, LockError>;

    /// The backend's semaphores, if it has them: itself, as a
    /// [`PermitBackend`]. The default is `None`: no semaphores.
    fn permits(&self) -> Option<&dyn PermitBackend> {
        None
    }

    /// The backend's read-write locks, if it has them: itself, as a
    /// [`RwBackend`]. The default is `None`: no read-write locks.
    fn rw(&self) -> Option<&dyn RwBackend> {
        None
    }

    /// Whether the backend takes several lock keys all or none in one call:
    /// itself, as an [`AllKeysBackend`]. The default is `None`: a
    /// [`MultiLock`](crate::MultiLock) takes its keys one by one.
    fn all_keys(&self) -> Option<&dyn AllKeysBackend> {
        None
    }
}

/// The semaphores of a backend that has them: the capability a
/// [`LockBackend`] offers through [`permits`](LockBackend::permits).
///
/// A permit is an ordinary [`Lease`] (its `key` is the semaphore name, its
/// `token` the permit's owner token, `resource` the backend's name for the
/// permit; `fencing_token` is the backend's own business: a
/// [`Permit`](crate::Permit) does not show it). The core remembers which
/// leases are permits: the watchdog batches permit leases apart from lock
/// leases and hands them to [`renew_permits`](PermitBackend::renew_permits),
/// and a permit's guard releases through
/// [`release_permit`](PermitBackend::release_permit). So
/// [`LockBackend::renew`] and [`LockBackend::release`] never see a permit
/// lease. The contract of [`LockBackend`] (cancel safety, transport
/// failures, local deadlines) holds here too.
///
/// - **memory**: a table of permit holders with deadlines, FIFO tickets.
/// - **redis**: a sorted set of permit tokens scored by expiry on the
///   server's clock; one script trims expired members, counts, and adds.
/// - **etcd**: the first N keys by create revision under the semaphore's
///   prefix hold permits; waiters watch the prefix for deletes.
/// - **zookeeper**: the first N ephemeral sequential nodes under the
///   semaphore's path hold permits; waiters watch the children.
///
/// # Example: a wrapping backend that passes semaphores through
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
/// use dlock::backend::{AcquireRequest, Lease, LockBackend, PermitBackend, PermitRequest, Renewal};
/// use dlock::{LockError, Semaphore};
///
/// #[derive(Debug)]
/// struct Wrapped(Arc<dyn LockBackend>);
///
/// #[dlock::async_trait]
/// impl LockBackend for Wrapped {
///     fn describe(&self) -> String { self.0.describe() }
///     async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
///         self.0.try_acquire(req).await
///     }
///     async fn acquire(&self, req: &AcquireRequest, deadline: Option<Instant>)
///         -> Result<Option<Lease>, LockError> { self.0.acquire(req, deadline).await }
///     async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
///         self.0.renew(leases).await
///     }
///     async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
///         self.0.release(lease).await
///     }
///     // Semaphores exactly when the wrapped backend has them.
///     fn permits(&self) -> Option<&dyn PermitBackend> { self.0.permits() }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let wrapped = Arc::new(Wrapped(dlock::connect("memory://").await?));
/// let permit = Semaphore::new("exports", 2).with_backend(wrapped).acquire().await?;
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait PermitBackend: Send + Sync {
    /// One attempt to take a permit of the semaphore `req.name`; never
    /// waits. `Ok(None)` means all `req.permits` permits are held.
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError>;

    /// Takes a permit, waiting until one is free or until `deadline`
    /// (`None`: no limit). `Ok(None)` means the deadline passed. Waiting is
    /// woken by the service, with a timer at the earliest permit expiry; it
    /// must be cancel safe, as [`LockBackend::acquire`].
    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError>;

    /// Extends every permit lease in `leases`, as [`LockBackend::renew`]
    /// does for locks: one answer per lease, in order.
    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>>;

    /// Gives a permit back if it is still ours, and wakes waiters.
    /// `Ok(false)` means it was no longer ours (expired).
    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError>;
}

/// The read-write locks of a backend that has them: the capability a
/// [`LockBackend`] offers through [`rw`](LockBackend::rw).
///
/// Any number of read leases or one write lease hold a key at once, and a
/// waiting writer is served before readers that asked after it (writers do
/// not starve). Every lease, read or write, is an ordinary [`Lease`] under
/// its own token with its own ttl: a crashed reader's share frees after its
/// ttl while the other readers keep theirs. The core remembers each lease's
/// mode and hands it back with every renewal and release, so
/// [`LockBackend::renew`] and [`LockBackend::release`] never see a
/// read-write lease. The contract of [`LockBackend`] (cancel safety,
/// transport failures, local deadlines) holds here too.
///
/// Fencing: write leases get strictly increasing tokens per key; a read
/// lease's `fencing_token` places it among the writes: it is at least the
/// token of every write lease granted on the key before it and below the
/// token of every write lease granted after it (the last write's token, or
/// the read's own revision where the service numbers every entry).
///
/// - **memory**: per key, a writer, a table of readers with deadlines, and
///   one FIFO queue of waiters of both modes.
/// - **etcd**: etcd's recipe `RWMutex`: a key per reader or writer, in line
///   by create revision; a reader waits for the newest older writer's key,
///   a writer for the newest older key, by a watch of its delete.
/// - **zookeeper**: Curator's `InterProcessReadWriteLock` layout: read and
///   write ephemeral sequential nodes in one queue; a writer waits for its
///   predecessor, a reader for the first write node ahead of it.
///
/// # Example: a wrapping backend that passes read-write locks through
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
/// use dlock::backend::{AcquireRequest, Lease, LockBackend, Renewal, RwBackend};
/// use dlock::{LockError, RwLock};
///
/// #[derive(Debug)]
/// struct Wrapped(Arc<dyn LockBackend>);
///
/// #[dlock::async_trait]
/// impl LockBackend for Wrapped {
///     fn describe(&self) -> String { self.0.describe() }
///     async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
///         self.0.try_acquire(req).await
///     }
///     async fn acquire(&self, req: &AcquireRequest, deadline: Option<Instant>)
///         -> Result<Option<Lease>, LockError> { self.0.acquire(req, deadline).await }
///     async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
///         self.0.renew(leases).await
///     }
///     async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
///         self.0.release(lease).await
///     }
///     // Read-write locks exactly when the wrapped backend has them.
///     fn rw(&self) -> Option<&dyn RwBackend> { self.0.rw() }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let wrapped = Arc::new(Wrapped(dlock::connect("memory://").await?));
/// let reader = RwLock::new("prices").with_backend(wrapped).read().await?;
/// reader.release().await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait RwBackend: Send + Sync {
    /// One attempt to take a `req.mode` lease on `req.key`; never waits.
    /// `Ok(None)` means the key is held against that mode (a writer, or for
    /// a write any reader), or a writer is waiting ahead of a reader.
    async fn try_acquire_rw(&self, req: &RwRequest) -> Result<Option<Lease>, LockError>;

    /// Takes a `req.mode` lease, waiting until the key admits it or until
    /// `deadline` (`None`: no limit). `Ok(None)` means the deadline passed.
    /// Waiting is woken by the service, with a timer at the earliest expiry
    /// of a lease in the way; it must be cancel safe, as
    /// [`LockBackend::acquire`].
    async fn acquire_rw(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError>;

    /// Extends every lease in `leases`, all of mode `mode`, as
    /// [`LockBackend::renew`] does for locks: one answer per lease, in order.
    async fn renew_rw(&self, mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>>;

    /// Gives a `mode` lease back if it is still ours, and wakes waiters.
    /// `Ok(false)` means it was no longer ours (expired or removed).
    async fn release_rw(&self, mode: RwMode, lease: &Lease) -> Result<bool, LockError>;
}
