//! The one acquire path of every lease: the outcome of a public acquire
//! (its span, `Busy` or `Timeout`), and the taking of one lease on a lock
//! key, a semaphore or a read-write lock (local turn → backend call →
//! register), handed over as a [`Taken`]. Reentrancy, which looks at the
//! caller's scope, is the lock kinds' (`locks/within.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::holder::{new_token, owner_token};
use crate::backend::{
    no_barriers, no_many_permits, no_rw_locks, no_semaphores, AcquireRequest, BarrierRequest,
    Lease, LockBackend, PermitRequest, RwMode, RwRequest,
};
use crate::lease::held::{release_on, LeaseKind, LeaseShared, NewLease};
use crate::lease::observe::{self, Acquisition, Kind, StaleReason};
use crate::lease::options::LeaseOptions;
use crate::lease::ride_through::RideThrough;
use crate::lease::watchdog::Watchdog;
use crate::{backend::deadline, lease::local, lease::on_time, LockError};

/// What a granted acquisition shows operators: whether it re-entered, and
/// its fence.
pub(crate) trait Observed {
    fn observed(&self) -> (bool, Option<u64>);
}

/// A public `acquire`: runs `attempt` with the options' wait in a
/// `dlock.acquire` span; not acquired is [`LockError::Busy`] after a single
/// attempt (a zero wait), else [`LockError::Timeout`].
pub(crate) async fn acquire<T, F>(
    options: &LeaseOptions,
    kind: Kind,
    attempt: impl FnOnce(Option<Duration>) -> F,
) -> Result<T, LockError>
where
    T: Observed,
    F: Future<Output = Result<Option<T>, LockError>>,
{
    let start = Instant::now();
    let wait = options.wait;
    let once = wait == Some(Duration::ZERO);
    match watched(options, kind, wait, once, attempt(wait)).await? {
        Some(held) => Ok(held),
        None if once => Err(LockError::Busy {
            key: options.key.to_string(),
        }),
        None => Err(LockError::Timeout {
            key: options.key.to_string(),
            waited: start.elapsed(),
        }),
    }
}

/// A public `try_acquire`: `attempt` once, never waiting, in a
/// `dlock.acquire` span; `Ok(None)` when not acquired.
pub(crate) async fn try_acquire<T, F>(
    options: &LeaseOptions,
    kind: Kind,
    attempt: impl FnOnce(Option<Duration>) -> F,
) -> Result<Option<T>, LockError>
where
    T: Observed,
    F: Future<Output = Result<Option<T>, LockError>>,
{
    let wait = Some(Duration::ZERO);
    watched(options, kind, wait, true, attempt(wait)).await
}

/// Runs `attempt` in a `dlock.acquire` span and records its outcome.
pub(crate) async fn watched<T: Observed>(
    options: &LeaseOptions,
    kind: Kind,
    wait: Option<Duration>,
    once: bool,
    attempt: impl Future<Output = Result<Option<T>, LockError>>,
) -> Result<Option<T>, LockError> {
    let watch = Acquisition::start(kind, &options.key, options.label(), options.ttl, wait);
    observe::watched(watch, once, attempt, |held: &T| held.observed()).await
}

/// What a lease is taken on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    /// The options' key, as a lock.
    Lock,
    /// The election named by the options' key, with this value, on a
    /// backend that keeps elections in a layout of its own
    /// ([`ElectionBackend::own_layout`](crate::backend::ElectionBackend::own_layout)):
    /// a lock lease on the entry the backend names in `resource`.
    Election { value: &'a str },
    /// `count` permits (one lease) of the semaphore named by the options'
    /// key, of `permits` permits.
    Permit { permits: usize, count: usize },
    /// A read or a write lease on the read-write lock of the options' key.
    Rw(RwMode),
    /// A member of the double barrier named by the options' key.
    Member { parties: usize },
}

/// A lease just taken, registered with its backend's watchdog: what the
/// guard of every lock kind is made of (`LockGuard::from`). The watchdog is
/// the one that lets the lease go when the guard is released.
pub(crate) struct Taken {
    pub(crate) shared: Arc<LeaseShared>,
    pub(crate) watchdog: Arc<Watchdog>,
}

/// Takes one lease on `target` from `backend`: this process's turn first
/// (so only the front local waiters talk to the service), then the backend
/// call, then the watchdog's registration. Waits up to `wait` (zero: one
/// attempt); `Ok(None)`: not acquired in time.
///
/// A transient failure (no answer in time, a reset, a restart) with time
/// left in `wait` is asked again (`ride_through.rs`); the last error is
/// returned once the wait is over.
///
/// A lease is handed over only if it is live at that instant: a grant whose
/// answer came after the lease's local deadline (a reply slower than the
/// ttl; the server may have expired the key and granted it to another
/// client meanwhile) is given back (compare-and-delete) and asked for again
/// within `wait`, still holding the local turn.
pub(crate) async fn take(
    options: &LeaseOptions,
    backend: Arc<dyn LockBackend>,
    target: Target<'_>,
    wait: Option<Duration>,
    observed: Kind,
) -> Result<Option<Taken>, LockError> {
    // Starts measuring suspends (`backend/suspend.rs`) before the first
    // request is sent: one sent earlier would miss those before the start.
    crate::backend::suspend::suspended();
    let local = local::for_backend(&backend);
    let once = wait == Some(Duration::ZERO);
    let deadline = wait.and_then(deadline::after);
    let (slot, weight) = match target {
        Target::Lock | Target::Election { .. } => (local.queue.slot(&options.key), 1),
        // A taker of `count` takes that much of the local gate too: tokio's
        // semaphore is fair, so later local takers of fewer wait behind it.
        Target::Permit { permits, count } => {
            (local.queue.semaphore_slot(&options.key, permits), count)
        }
        Target::Rw(mode) => local.queue.rw_slot(&options.key, mode),
        Target::Member { parties } => (local.queue.barrier_slot(&options.key, parties), 1),
    };
    let Some(turn) = local.queue.turn_of(slot, weight, once, deadline).await else {
        return Ok(None);
    };

    let kind = match target {
        Target::Lock | Target::Election { .. } => LeaseKind::Lock,
        Target::Permit { .. } => LeaseKind::Permit,
        Target::Rw(mode) => LeaseKind::Rw(mode),
        Target::Member { .. } => LeaseKind::Member,
    };
    let mut ride = RideThrough::new(once, deadline);
    let lease = loop {
        // A transient failure with time left in the wait is asked again
        // (`ride_through.rs`), with a new owner token.
        // Cut a second past the wait: a silent server must not stretch
        // a short wait to its request timeout (`on_time.rs`).
        let asked = on_time::within_the_wait(
            || backend.describe(),
            if once { None } else { deadline },
            ask(options, &*backend, target, once, deadline),
        )
        .await;
        let asked = match asked {
            Err(e) => {
                ride.after(&options.key, e).await?;
                continue;
            }
            Ok(asked) => asked,
        };
        ride.answered(&options.key, asked.is_some())?;
        let Some(lease) = asked else {
            return Ok(None);
        };
        // A host suspended while the request was out counts too.
        let now = crate::backend::suspend::lease_now(&lease);
        if now < lease.valid_until {
            break lease;
        }
        observe::stale_grant(
            &options.key,
            &options.label(),
            observed,
            StaleReason::LateAnswer,
            now - lease.valid_until,
        );
        // Ours to delete if the server still has it; a no-op if it expired
        // there (compare-and-delete). A failure leaves it to its ttl, which
        // is already over here.
        let _ = release_on(&*backend, kind, &lease).await;
        if once || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    };

    let settling = crate::lease::background::Settling::enter();
    if settling.closed() {
        // `dlock::shutdown` began: its collection of leases may be over.
        let _ = release_on(&*backend, kind, &lease).await;
        return Err(LockError::ShutDown);
    }
    let shared = LeaseShared::new(NewLease {
        backend,
        lease,
        renew: options.renew,
        kind,
        turn,
        label: options.label(),
        observed,
        hold_at_least: options.hold_at_least,
    });
    local.watchdog.register(&shared);
    drop(settling);
    Ok(Some(Taken {
        shared,
        watchdog: local.watchdog.clone(),
    }))
}

/// One backend call for a lease on `target` with a new owner token: one
/// attempt (`once`), or waiting on the server up to `deadline`.
async fn ask(
    options: &LeaseOptions,
    backend: &dyn LockBackend,
    target: Target<'_>,
    once: bool,
    deadline: Option<Instant>,
) -> Result<Option<Lease>, LockError> {
    match target {
        Target::Lock => {
            let token = owner_token(backend)?;
            let request = AcquireRequest {
                key: options.key.to_string(),
                token,
                ttl: options.ttl,
            };
            if once {
                backend.try_acquire(&request).await
            } else {
                backend.acquire(&request, deadline).await
            }
        }
        Target::Election { value } => {
            let token = owner_token(backend)?;
            let Some(elections) = backend.election() else {
                return Err(crate::backend::no_elections(&backend.describe()));
            };
            let request = AcquireRequest {
                key: options.key.to_string(),
                token,
                ttl: options.ttl,
            };
            let deadline = if once { Some(Instant::now()) } else { deadline };
            elections.campaign(&request, value, deadline, once).await
        }
        Target::Permit { permits, count } => {
            // The client name in the token is what `Semaphore::inspect` shows.
            let token = owner_token(backend)?;
            // The one place a backend without semaphores is told so.
            let Some(semaphores) = backend.permits() else {
                return Err(no_semaphores(&backend.describe()));
            };
            // And the one place a backend that weighs no holders is.
            if count > 1 && !semaphores.many_permits() {
                return Err(no_many_permits(&backend.describe(), count));
            }
            let request = PermitRequest {
                name: options.key.to_string(),
                permits,
                count,
                token,
                ttl: options.ttl,
            };
            if once {
                semaphores.try_acquire_permit(&request).await
            } else {
                semaphores.acquire_permit(&request, deadline).await
            }
        }
        Target::Rw(mode) => {
            let token = new_token()?;
            // The one place a backend without read-write locks is told so.
            let Some(rw) = backend.rw() else {
                return Err(no_rw_locks(&backend.describe()));
            };
            let request = RwRequest {
                key: options.key.to_string(),
                mode,
                token,
                ttl: options.ttl,
            };
            if once {
                rw.try_acquire_rw(&request).await
            } else {
                rw.acquire_rw(&request, deadline).await
            }
        }
        Target::Member { parties } => {
            let token = new_token()?;
            // The one place a backend without barriers is told so.
            let Some(barriers) = backend.barrier() else {
                return Err(no_barriers(&backend.describe()));
            };
            let request = BarrierRequest {
                name: options.key.to_string(),
                parties,
                token,
                ttl: options.ttl,
            };
            // A barrier has no one-attempt form: entering is waiting.
            let deadline = if once { Some(Instant::now()) } else { deadline };
            barriers.enter_barrier(&request, deadline).await
        }
    }
}
