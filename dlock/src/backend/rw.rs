//! The read-write lock capability: what the core asks of a backend that
//! has read-write locks ([`RwBackend`], offered through
//! [`LockBackend::rw`](super::LockBackend::rw)), and the error of one that
//! has none.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Lease, Renewal};
use crate::LockError;

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
/// [`RwLock`](crate::RwLock) answers when [`LockBackend::rw`](super::LockBackend::rw) is `None`.
/// It names the backend (`backend` is its
/// [`describe`](super::LockBackend::describe) text) and the backends that have
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
        crate::backend::schemes::with_rw_locks_listed()
    ))
}

/// The read-write locks of a backend that has them: the capability a
/// [`LockBackend`](super::LockBackend) offers through [`rw`](super::LockBackend::rw).
///
/// Any number of read leases or one write lease hold a key at once, and a
/// waiting writer is served before readers that asked after it (writers do
/// not starve). Every lease, read or write, is an ordinary [`Lease`] under
/// its own token with its own ttl: a crashed reader's share frees after its
/// ttl while the other readers keep theirs. The core remembers each lease's
/// mode and hands it back with every renewal and release, so
/// [`LockBackend::renew`](super::LockBackend::renew) and
/// [`LockBackend::release`](super::LockBackend::release) never see a
/// read-write lease. The contract of [`LockBackend`](super::LockBackend)
/// (cancel safety, transport failures, local deadlines) holds here too.
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
/// #[dlock::backend::async_trait]
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
    /// [`LockBackend::acquire`](super::LockBackend::acquire).
    async fn acquire_rw(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError>;

    /// Extends every lease in `leases`, all of mode `mode`, as
    /// [`LockBackend::renew`](super::LockBackend::renew) does for locks: one
    /// answer per lease, in order.
    async fn renew_rw(&self, mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>>;

    /// Gives a `mode` lease back if it is still ours, and wakes waiters.
    /// `Ok(false)` means it was no longer ours (expired or removed).
    async fn release_rw(&self, mode: RwMode, lease: &Lease) -> Result<bool, LockError>;
}
