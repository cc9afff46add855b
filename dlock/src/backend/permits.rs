//! The semaphore capability: what the core asks of a backend that has
//! semaphores ([`PermitBackend`], offered through
//! [`LockBackend::permits`](super::LockBackend::permits)), and the error of
//! one that has none.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Lease, Renewal, SemaphoreInfo};
use crate::LockError;

/// What the core asks a backend to take: `count` permits of a counting
/// semaphore, as one lease.
///
/// A permit is held under its own token and leased on its own, so a crashed
/// holder's permit comes back after its ttl. A request for `count` permits
/// is one holder of weight `count`: granted whole or not at all, renewed and
/// released under its one token, and it frees all `count` when it ends.
#[derive(Clone, PartialEq, Eq)]
pub struct PermitRequest {
    /// The validated semaphore name, before the backend maps it into its namespace.
    pub name: String,
    /// How many holders the semaphore admits at once (at least 1). Every
    /// user of one semaphore must give the same number: the backend stores
    /// it with the semaphore's first holder and refuses another count with
    /// [`permit_count_differs`] while any permit is out.
    pub permits: usize,
    /// How many of the `permits` this request takes at once: 1 is the single
    /// permit of [`Semaphore::acquire`](crate::Semaphore::acquire); more is
    /// [`acquire_many`](crate::Semaphore::acquire_many). The core checks
    /// `1 <= count <= permits` before asking, and asks for more than 1 only
    /// of a backend whose [`many_permits`](PermitBackend::many_permits) is
    /// true.
    pub count: usize,
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
            .field("count", &self.count)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// The error of a backend that has no semaphores: what
/// [`Semaphore`](crate::Semaphore) answers when
/// [`LockBackend::permits`](super::LockBackend::permits) is `None`. It names the backend
/// (`backend` is its [`describe`](super::LockBackend::describe) text) and the
/// backends that have semaphores.
///
/// ```
/// let e = dlock::backend::no_semaphores("zk://127.0.0.1:2181");
/// assert!(matches!(e, dlock::LockError::InvalidOption { .. }));
/// ```
pub fn no_semaphores(backend: &str) -> LockError {
    LockError::invalid_option(format!(
        "the {backend} backend has no semaphores yet; use a {} backend for `Semaphore`",
        crate::backend::schemes::with_semaphores_listed()
    ))
}

/// The error of a caller asking `count` permits at once of a backend whose
/// semaphores take one permit per request
/// ([`PermitBackend::many_permits`] is false): a [`LockError::InvalidOption`]
/// naming the backend (`backend` is its
/// [`describe`](super::LockBackend::describe) text) and the backends whose
/// semaphores take several.
///
/// ```
/// let e = dlock::backend::no_many_permits("mysql://127.0.0.1:3306/db", 3);
/// assert!(matches!(e, dlock::LockError::InvalidOption { .. }));
/// assert!(e.to_string().contains("semaphores take one permit at a time"));
/// ```
pub fn no_many_permits(backend: &str, count: usize) -> LockError {
    LockError::invalid_option(format!(
        "the {backend} backend's semaphores take one permit at a time, not {count} at once; \
         use a {} backend for `Semaphore::acquire_many`",
        crate::backend::schemes::with_many_permits_listed()
    ))
}

/// The error of a caller whose permit count is not the one stored on the
/// server: the semaphore `name` has `stored` permits there (written by its
/// first holder), and this caller asked for `asked`. A
/// [`LockError::InvalidOption`] naming both numbers, instead of a permit:
/// two counts at once would let more holders in than either expects. The
/// stored count goes away with the semaphore's last permit, so a new
/// deployment may change the count once every holder is gone.
///
/// ```
/// let e = dlock::backend::permit_count_differs("exports", 3, 1);
/// assert!(matches!(e, dlock::LockError::InvalidOption { .. }));
/// assert!(e.to_string().contains("has 3 permits on the server, this caller asked for 1"));
/// ```
pub fn permit_count_differs(name: &str, stored: usize, asked: usize) -> LockError {
    LockError::invalid_option(format!(
        "semaphore `{name}` has {stored} permits on the server, this caller asked for {asked}: \
         use the same count everywhere, or another name (the stored count goes away with the last permit)"
    ))
}

/// The semaphores of a backend that has them: the capability a
/// [`LockBackend`](super::LockBackend) offers through [`permits`](super::LockBackend::permits).
///
/// A permit is an ordinary [`Lease`] (its `key` is the semaphore name, its
/// `token` the permit's owner token, `resource` the backend's name for the
/// permit; `fencing_token` is the backend's own business: a
/// [`Permit`](crate::Permit) does not show it). The core remembers which
/// leases are permits: the watchdog batches permit leases apart from lock
/// leases and hands them to [`renew_permits`](PermitBackend::renew_permits),
/// and a permit's guard releases through
/// [`release_permit`](PermitBackend::release_permit). So
/// [`LockBackend::renew`](super::LockBackend::renew) and
/// [`LockBackend::release`](super::LockBackend::release) never see a permit
/// lease. The contract of [`LockBackend`](super::LockBackend) (cancel
/// safety, transport failures, local deadlines) holds here too.
///
/// - **memory**: a table of permit holders with deadlines, FIFO tickets.
/// - **redis**: a sorted set of permit tokens scored by expiry on the
///   server's clock; one script trims expired members, counts, and adds.
/// - **etcd**: the first N keys by create revision under the semaphore's
///   prefix hold permits; waiters watch the prefix for deletes.
/// - **zookeeper**: the first N ephemeral sequential nodes under the
///   semaphore's path hold permits; waiters watch the children.
/// - **mysql**: N slot named locks (`GET_LOCK`), the count in a row
///   changed under an admin lock; waiters queue on a door lock.
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
    /// waits. `Ok(None)` means all `req.permits` permits are held. A
    /// backend stores `req.permits` with the semaphore's first holder and
    /// answers [`permit_count_differs`] to a request with another count
    /// while a permit is out (here and in
    /// [`acquire_permit`](Self::acquire_permit)).
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError>;

    /// Takes a permit, waiting until one is free or until `deadline`
    /// (`None`: no limit). `Ok(None)` means the deadline passed. Waiting is
    /// woken by the service, with a timer at the earliest permit expiry; it
    /// must be cancel safe, as [`LockBackend::acquire`](super::LockBackend::acquire).
    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError>;

    /// Extends every permit lease in `leases`, as [`LockBackend::renew`](super::LockBackend::renew)
    /// does for locks: one answer per lease, in order.
    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>>;

    /// Gives a permit back if it is still ours, and wakes waiters.
    /// `Ok(false)` means it was no longer ours (expired).
    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError>;

    /// Whether a request may take several permits at once
    /// ([`PermitRequest::count`] above 1): all of them or none, without a
    /// partial hold, and a waiter of `count` served in arrival order (no
    /// later waiter of fewer permits takes its place). False by default: a
    /// backend written before `count` existed would take one permit for
    /// any count, so the core refuses `count > 1` with [`no_many_permits`]
    /// unless the backend says it weighs its holders.
    fn many_permits(&self) -> bool {
        false
    }

    /// How many permits of the semaphore `name` (of `permits` permits) are
    /// free now: `permits` minus the live holders' counts, `permits` when
    /// nobody holds one (never below 0). Reads the server once; the answer
    /// may be stale by the time it arrives. A semaphore stored with another
    /// count is [`permit_count_differs`].
    ///
    /// The default is a [`LockError::InvalidOption`] saying the backend
    /// cannot tell: there is no correct answer without reading its holders.
    async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        let _ = permits;
        Err(LockError::invalid_option(format!(
            "this backend cannot read how many permits of semaphore `{name}` are free"
        )))
    }

    /// The holders of the semaphore `name` and its stored count, read
    /// without taking anything ([`Semaphore::inspect`](crate::Semaphore::inspect)).
    /// The default: a [`LockError::InvalidOption`] saying the backend cannot.
    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        Err(LockError::invalid_option(format!(
            "this backend cannot read the holders of semaphore `{name}`"
        )))
    }

    /// The names of the semaphores starting with `prefix` that may have
    /// holders now (a name found is then inspected; one just freed may
    /// come back without holders). The default: a
    /// [`LockError::InvalidOption`] saying the backend cannot list them.
    async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let _ = prefix;
        Err(LockError::invalid_option(
            "this backend cannot list its semaphores; inspect one by name".to_owned(),
        ))
    }
}
