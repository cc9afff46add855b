//! The seam between the core and a coordination service: [`LockBackend`] and
//! the small values that cross it. The capabilities some backends add have
//! a file each: semaphores (`permits.rs`), read-write locks (`rw.rs`),
//! several keys in one call (`all_keys.rs`), leader election
//! (`election.rs`), double barriers (`barrier.rs`). Beside them, the contract's vocabulary that the core and
//! every backend share: the one error type (`error.rs`), key validation
//! (`key.rs`), overflow-free deadlines (`deadline.rs`), the table of URL
//! schemes (`schemes.rs`), and the holder's identity (`holder.rs`: owner
//! tokens, client names, `LockInfo`).
//!
//! # What a backend must guarantee
//!
//! For [`LockBackend`] and [`PermitBackend`] alike: a cancel-safe `acquire`;
//! transport failures as [`LockError::Backend`]; a wait that runs out as
//! `Ok(None)` even with a request in flight (the Redis backend drops the
//! request, whose release-if-dropped guard gives back a grant answered too
//! late; `Backend` only for a server that failed or stayed silent, as etcd's
//! and ZooKeeper's one-second stall line); `valid_until` from
//! [`lease_deadline`] or stricter; credentials never in `describe()`.
//! `renew` and `release` never see a permit lease or a read-write lease, so a
//! backend's lock protocol does not change when it adds semaphores or
//! read-write locks. [`RwBackend`] adds: any number of readers or one writer;
//! a waiting writer served before readers that ask after it; each lease
//! (every reader's too) expiring on its own; write fences strictly increasing
//! per key, a read's fence at least every earlier write's and below every later write's.

use std::fmt;
use std::time::{Duration, Instant};

use crate::LockError;

mod all_keys;
mod barrier;
pub(crate) mod deadline;
mod election;
pub(crate) mod error;
pub(crate) mod holder;
pub(crate) mod key;
mod latch;
mod permit_holders;
mod permits;
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) mod refusal;
mod rw;
pub(crate) mod schemes;
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub(crate) mod silence;
pub(crate) mod suspend;
#[cfg(feature = "tls")]
pub(crate) mod tls_provider;
pub(crate) mod transient;
pub use all_keys::{AllKeysBackend, AllOrNone};
pub use barrier::{no_barriers, BarrierBackend, BarrierRequest};
pub use election::{
    no_elections, ElectionBackend, Leader, LeaderChange, LeaderChanges, MAX_VALUE_BYTES,
};
pub use key::invisible_char;
pub use latch::{no_latches, LatchBackend};
pub use permit_holders::{PermitHolder, SemaphoreInfo};
pub use permits::{
    no_many_permits, no_semaphores, permit_count_differs, PermitBackend, PermitRequest,
};
pub use rw::{no_rw_locks, RwBackend, RwMode, RwRequest};

/// The attribute the backend traits are written with: an implementation
/// outside dlock writes `#[dlock::backend::async_trait]` on its `impl`
/// blocks (or uses the `async-trait` crate directly).
///
/// ```
/// #[dlock::backend::async_trait]
/// trait Ping {
///     async fn ping(&self) -> bool;
/// }
/// ```
pub use async_trait::async_trait;

/// What a backend offers beside plain locks, as
/// [`LockBackend::capabilities`] answers it: each capability is the
/// backend itself seen as that trait, or `None`.
///
/// ```
/// use dlock::backend::{Capabilities, LockBackend};
/// use dlock::backends::memory::MemoryBackend;
///
/// let memory = MemoryBackend::new();
/// let offers = memory.capabilities();
/// assert!(offers.permits.is_some() && offers.rw.is_some() && offers.election.is_some());
/// assert!(Capabilities::default().permits.is_none());
/// ```
#[derive(Clone, Copy, Default)]
pub struct Capabilities<'a> {
    /// Semaphores: [`LockBackend::permits`].
    pub permits: Option<&'a dyn PermitBackend>,
    /// Read-write locks: [`LockBackend::rw`].
    pub rw: Option<&'a dyn RwBackend>,
    /// Leader elections: [`LockBackend::election`].
    pub election: Option<&'a dyn ElectionBackend>,
    /// Count-down latches: [`LockBackend::latch`]. Not part of
    /// [`all`](Self::all): a backend that has them writes
    /// `Capabilities { latch: Some(self), ..Capabilities::all(self) }`.
    pub latch: Option<&'a dyn LatchBackend>,
    /// Double barriers: [`LockBackend::barrier`].
    pub barrier: Option<&'a dyn BarrierBackend>,
}

impl<'a> Capabilities<'a> {
    /// All three, each `backend` itself: what a backend that implements
    /// [`PermitBackend`], [`RwBackend`] and [`ElectionBackend`] answers.
    pub fn all<B: PermitBackend + RwBackend + ElectionBackend>(backend: &'a B) -> Self {
        Capabilities {
            permits: Some(backend),
            rw: Some(backend),
            election: Some(backend),
            latch: None,
            barrier: None,
        }
    }
}

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

impl Lease {
    /// A lease without a fencing token for `key`, held under `token` for
    /// `ttl` until `valid_until` (local), on the backend's `resource`;
    /// a backend with fences sets [`fencing_token`](Self::fencing_token).
    pub(crate) fn unfenced(
        key: &str,
        token: &str,
        ttl: Duration,
        valid_until: Instant,
        resource: String,
    ) -> Self {
        Lease {
            key: key.to_owned(),
            token: token.to_owned(),
            ttl,
            fencing_token: None,
            valid_until,
            resource,
        }
    }
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
    crate::backend::deadline::saturating_add(sent, ttl.saturating_sub(drift(ttl)))
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
///   A wait that runs out is `Ok(None)`, never `Backend`, even when a
///   request was in flight at that instant (drop it, and give back what it
///   may have taken).
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
/// #[dlock::backend::async_trait]
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

    /// Gives the lease back so that its key stays taken `remaining` more
    /// (a lock's `hold_at_least`): if it is still ours, its expiry on the
    /// server becomes `remaining` from now, instead of a delete, and no
    /// release is announced (waiters wake at its expiry). `Ok(Some(false))`:
    /// no longer ours. The default, `Ok(None)`, says the backend cannot;
    /// the core then keeps the lease, renewed, and releases it at the time.
    async fn release_after(
        &self,
        lease: &Lease,
        remaining: Duration,
    ) -> Result<Option<bool>, LockError> {
        let _ = (lease, remaining);
        Ok(None)
    }

    /// An alarm the backend raises (a new value) when leases it granted may
    /// have been lost with no renewal asking: a session or connection that
    /// carried them ended (PostgreSQL's session advisory locks are freed by
    /// the server the moment their session ends). The watchdog then renews
    /// every lease of this backend at once, and [`renew`](Self::renew)'s
    /// answers report the lost ones, instead of at their next renewal
    /// (up to a third of the ttl later). The default is `None`: losses are
    /// found by renewals alone.
    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// What the backend offers beside plain locks: semaphores, read-write
    /// locks, leader elections. A backend with all three answers
    /// [`Capabilities::all`]`(self)`; the default is none of them.
    /// [`permits`](Self::permits), [`rw`](Self::rw) and
    /// [`election`](Self::election) read it.
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default()
    }

    /// The backend's semaphores, if it has them: itself, as a
    /// [`PermitBackend`]. The default is what
    /// [`capabilities`](Self::capabilities) says (by default `None`: no
    /// semaphores).
    fn permits(&self) -> Option<&dyn PermitBackend> {
        self.capabilities().permits
    }

    /// The backend's read-write locks, if it has them: itself, as a
    /// [`RwBackend`]. The default is what
    /// [`capabilities`](Self::capabilities) says (by default `None`: no
    /// read-write locks).
    fn rw(&self) -> Option<&dyn RwBackend> {
        self.capabilities().rw
    }

    /// The backend's leader elections, if it has them: itself, as an
    /// [`ElectionBackend`]. The default is what
    /// [`capabilities`](Self::capabilities) says (by default `None`: no
    /// elections, [`no_elections`]).
    fn election(&self) -> Option<&dyn ElectionBackend> {
        self.capabilities().election
    }

    /// The backend's count-down latches, if it has them: itself, as a
    /// [`LatchBackend`]. The default is what
    /// [`capabilities`](Self::capabilities) says (by default `None`: no
    /// latches, [`no_latches`]).
    fn latch(&self) -> Option<&dyn LatchBackend> {
        self.capabilities().latch
    }

    /// The backend's double barriers, if it has them: itself, as a
    /// [`BarrierBackend`]. The default is what
    /// [`capabilities`](Self::capabilities) says (by default `None`: no
    /// barriers, [`no_barriers`]).
    fn barrier(&self) -> Option<&dyn BarrierBackend> {
        self.capabilities().barrier
    }

    /// Whether the backend takes several lock keys all or none in one call:
    /// itself, as an [`AllKeysBackend`]. The default is `None`: a
    /// [`MultiLock`](crate::MultiLock) takes its keys one by one.
    fn all_keys(&self) -> Option<&dyn AllKeysBackend> {
        None
    }

    /// The client name this backend writes beside each lock lease it takes
    /// (see [`crate::inspect`]): `?client_name=` from its URL, by default
    /// [`default_client_name`](crate::default_client_name). `None`: none.
    fn client_name(&self) -> Option<&str> {
        Some(holder::default_client_name())
    }

    /// Who holds the lock `key` (not a semaphore or read-write lock of
    /// that name): `None` when it is free. The default is an
    /// [`InvalidOption`](LockError::InvalidOption) error: not supported.
    async fn inspect(&self, key: &str) -> Result<Option<crate::LockInfo>, LockError> {
        let _ = key;
        Err(holder::not_supported(&self.describe(), "inspecting a lock"))
    }

    /// Removes the lease on the lock `key` whoever holds it, and wakes its
    /// waiters: `true` if a lease was removed. The holder's next renewal
    /// must be refused, and the next holder's fencing token must be greater.
    /// The default is an [`InvalidOption`](LockError::InvalidOption) error.
    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let _ = key;
        Err(holder::not_supported(&self.describe(), "a forced release"))
    }

    /// The lock keys held now that start with `prefix`, each with what
    /// [`inspect`](LockBackend::inspect) shows, sorted by key, at most
    /// [`MAX_LISTED`](crate::inspect::MAX_LISTED) of them (more:
    /// [`too_many_to_list`](crate::inspect::too_many_to_list)). Called
    /// through [`list_locks`](crate::list_locks), which checks the prefix.
    /// Every backend of this crate lists; the default is an
    /// [`InvalidOption`](LockError::InvalidOption) error: not supported.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, crate::LockInfo)>, LockError> {
        let _ = prefix;
        Err(holder::not_supported(&self.describe(), "listing locks"))
    }
}
