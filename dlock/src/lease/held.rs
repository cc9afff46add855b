//! The held lease: its record shared by guards, scopes and the watchdog
//! (`LeaseShared`), its status, its loss, and the release path that hands
//! this process's turn on at the release's first poll.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use tracing::Instrument;

use crate::backend::suspend::lease_now;
use crate::backend::{
    no_barriers, no_rw_locks, no_semaphores, Lease, LockBackend, Renewal, RwMode,
};
use crate::lease::observe::{self, Holding, LossReason};
use crate::lease::queue::Turn;
use crate::LockError;

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Held,
    Released,
    Lost,
}

/// What a lease is a lease on: it decides which backend calls renew and
/// release it ([`renew_on`] and [`release_on`], the only places that ask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// A lock key: `renew` / `release`.
    Lock,
    /// One permit of a semaphore: the backend's `PermitBackend`.
    Permit,
    /// A read or a write lease on a read-write lock: the backend's
    /// `RwBackend`, told the mode.
    Rw(RwMode),
    /// A member of a double barrier: the backend's `BarrierBackend`.
    Member,
}

/// The mutable part of a lease, updated by the watchdog.
#[derive(Debug)]
pub(crate) struct LeaseState {
    pub(crate) lease: Lease,
    pub(crate) status: Status,
    /// When the watchdog should next renew (ignored when renewal is off).
    pub(crate) next_renew: Instant,
    /// A renewal of this lease is in flight.
    pub(crate) renewing: bool,
}

/// One lease, shared by its guard, any reentrant guards, the scopes run
/// inside it and the watchdog.
pub(crate) struct LeaseShared {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) renew: bool,
    pub(crate) kind: LeaseKind,
    pub(crate) state: Mutex<LeaseState>,
    pub(crate) lost: CancellationToken,
    /// The runtime the lease was acquired on: `Drop` queues the release here.
    runtime: Handle,
    /// This process's turns: on the key (or the semaphore), and a segmented
    /// lock's admission. Given back once the release is sent, or at once
    /// when the lease is lost, so the next local waiter asks the service.
    turns: Mutex<Vec<Turn>>,
    /// What operators see of the hold: its backend label, kind and start.
    holding: Holding,
    /// `hold_at_least` after the acquisition: a release before then keeps
    /// the key taken until then.
    hold_until: Option<Instant>,
}

impl fmt::Debug for LeaseShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseShared")
            .field("key", &self.key)
            .field("fencing_token", &self.fencing_token)
            .field("status", &self.lock_state().status)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Updates under these mutexes are plain assignments; poisoning cannot
    // leave them inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) struct NewLease {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) lease: Lease,
    pub(crate) renew: bool,
    pub(crate) kind: LeaseKind,
    pub(crate) turn: Turn,
    /// The `backend` label operators see (a registered name or a scheme).
    pub(crate) label: Arc<str>,
    /// The `kind` label: a lock, a segment or a permit.
    pub(crate) observed: observe::Kind,
    /// The lock's `hold_at_least`.
    pub(crate) hold_at_least: Option<Duration>,
}

impl LeaseShared {
    pub(crate) fn new(parts: NewLease) -> Arc<Self> {
        let lease = parts.lease;
        let next_renew = crate::backend::deadline::saturating_add(Instant::now(), lease.ttl / 3);
        Arc::new(LeaseShared {
            backend: parts.backend,
            key: lease.key.clone(),
            token: lease.token.clone(),
            fencing_token: lease.fencing_token,
            renew: parts.renew,
            kind: parts.kind,
            state: Mutex::new(LeaseState {
                lease,
                status: Status::Held,
                next_renew,
                renewing: false,
            }),
            lost: CancellationToken::new(),
            runtime: Handle::current(),
            turns: Mutex::new(vec![parts.turn]),
            holding: Holding::begin(parts.label, parts.observed),
            hold_until: parts
                .hold_at_least
                .map(|at_least| crate::backend::deadline::saturating_add(Instant::now(), at_least)),
        })
    }

    /// Keeps `turn` with the lease's own, to be given back with them; gives
    /// it back at once if the lease is no longer held.
    pub(crate) fn keep_turn(&self, turn: Turn) {
        let mut turns = lock(&self.turns);
        if self.lock_state().status == Status::Held {
            turns.push(turn);
        }
    }

    /// Gives back this process's turns on the key: the next local waiter
    /// goes to the service.
    fn give_up_turns(&self) {
        let turns = std::mem::take(&mut *lock(&self.turns));
        drop(turns);
    }

    /// The `backend` label of this lease's spans and metrics.
    pub(crate) fn label(&self) -> &Arc<str> {
        &self.holding.backend
    }

    pub(crate) fn lock_state(&self) -> MutexGuard<'_, LeaseState> {
        lock(&self.state)
    }

    pub(crate) fn is_held(&self) -> bool {
        let state = self.lock_state();
        // A suspended host's time counts (`backend/suspend.rs`).
        state.status == Status::Held && lease_now(&state.lease) < state.lease.valid_until
    }

    /// Marks the lease lost (if it was held) and wakes every `lost()` future.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        let mut state = self.lock_state();
        if state.status == Status::Held {
            state.status = Status::Lost;
            drop(state);
            self.holding.end();
            self.holding.lost(&self.key, self.fencing_token, reason);
            self.lost.cancel();
            // A lost lease keeps nobody of this process out: other processes
            // are not kept out either, and the guard may live on for long.
            self.give_up_turns();
        }
    }

    /// The part of a release that cannot wait: the status, so the watchdog
    /// stops renewing and reentrancy stops. Returns whether the lease was
    /// still held; `Err` if it was released already. The caller takes it
    /// off its watchdog.
    pub(crate) fn begin_release(&self) -> Result<bool, ()> {
        let was = {
            let mut state = self.lock_state();
            let was = state.status;
            if was == Status::Released {
                return Err(());
            }
            let expired = lease_now(&state.lease) >= state.lease.valid_until;
            state.status = Status::Released;
            if was == Status::Held {
                self.holding.end();
            }
            was == Status::Held && !expired
        };
        Ok(was)
    }

    /// Whether this lease is on `backend` (the very object, not an equal one).
    pub(crate) fn is_on(&self, backend: &Arc<dyn LockBackend>) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.backend), Arc::as_ptr(backend))
    }

    /// Queues [`finish_release`](Self::finish_release) to the runtime the
    /// lease was acquired on. Never blocks and never panics. If that runtime
    /// is gone or shuts down before the release is done, the task is dropped
    /// there, and the release runs on dlock's background runtime instead (so
    /// does a release that failed there, once more):
    /// the backend's connection may well live on a runtime that still runs
    /// (and on etcd and ZooKeeper, a key on a shared session would otherwise
    /// outlive its ttl).
    pub(crate) fn finish_in_background(self: Arc<Self>, was_held: bool) {
        let runtime = self.runtime.clone();
        let mut elsewhere = ReleaseElsewhere(Some((self, was_held)));
        // Counted in flight: `dlock::shutdown` waits for it (bounded).
        drop(
            runtime.spawn(crate::lease::background::in_flight::tracked(async move {
                if let Some((shared, was_held)) = elsewhere.0.clone() {
                    let released = shared.finish_release(was_held).await;
                    // Failed here (not "not held"): left armed, so it is
                    // tried once more on dlock's runtime, as if dropped. A
                    // runtime shutting down fails the releases queued on
                    // its lane ("dropped unsent") yet may still poll a few
                    // of them to the end on another worker: 1 key of 2,000
                    // was left to its ttl in 4 of 6 runs of
                    // `redis_mass_drop.rs`. A compare-and-delete is safe to
                    // send twice; its span and metrics count both tries.
                    if !matches!(released, Ok(()) | Err(LockError::NotHeld { .. })) {
                        return;
                    }
                }
                elsewhere.disarm();
            })),
        );
    }

    /// Compare-and-delete on the server; this process's turn on the key goes
    /// to the next local waiter as soon as the release request is on its
    /// way, not when its answer is back.
    ///
    /// Why then: a backend sends a process's requests in order (one Redis
    /// connection per backend, one ZooKeeper session), so the waiter's
    /// acquire reaches the server right behind the release and the hand-off
    /// costs one round trip instead of two. Where the order is not kept (an
    /// etcd channel, a batched Redis release), the waiter finds the key
    /// still held and waits for the release the server announces: slower,
    /// never unsafe, as the server decides who holds the key.
    pub(crate) async fn finish_release(self: Arc<Self>, was_held: bool) -> Result<(), LockError> {
        let span = observe::release_span(&self.key, &self.holding.backend, self.holding.kind);
        let result = self.send_release(was_held).instrument(span.clone()).await;
        observe::released(&span, &result);
        result
    }

    /// The release itself, handing the turn on after its first poll; before
    /// `hold_until`, [`release_later`](Self::release_later).
    async fn send_release(self: Arc<Self>, was_held: bool) -> Result<(), LockError> {
        let now = Instant::now();
        match self.hold_until {
            Some(until) if was_held && now < until => self.release_later(until).await,
            _ => self.release_now(was_held).await,
        }
    }

    /// A release before `hold_until`: the key stays taken until then. A lock
    /// on a backend that can (Redis, Redlock) is left to expire on the
    /// server at that time ([`LockBackend::release_after`]), which holds
    /// even if this process dies; anything else stays held here, renewed,
    /// and is released at that time by a task on dlock's background
    /// runtime, this process's turn on the key kept until then.
    async fn release_later(self: Arc<Self>, until: Instant) -> Result<(), LockError> {
        if matches!(self.kind, LeaseKind::Lock) {
            let lease = self.lock_state().lease.clone();
            let remaining = until.saturating_duration_since(Instant::now());
            if let Some(kept) = self.backend.release_after(&lease, remaining).await? {
                tracing::debug!(key = %self.key, ?remaining, kept, "released, kept on the server for hold_at_least");
                // Local waiters go to the server, which answers with the
                // time left, and wake at the expiry.
                self.give_up_turns();
                return if kept {
                    Ok(())
                } else {
                    Err(LockError::NotHeld {
                        key: self.key.clone(),
                    })
                };
            }
        }
        tracing::debug!(key = %self.key, remaining = ?until.saturating_duration_since(Instant::now()), "release deferred for hold_at_least");
        crate::lease::background::spawn_daemon(async move {
            self.keep_until(until).await;
            report_background(self.release_now(true).await);
        });
        Ok(())
    }

    /// Keeps a released lease alive until `until` (renewing it, if its
    /// renewal is on, every ttl/3), or until the server says it is gone.
    async fn keep_until(&self, until: Instant) {
        loop {
            let (lease, valid_until) = {
                let state = self.lock_state();
                (state.lease.clone(), state.lease.valid_until)
            };
            let now = Instant::now();
            if now >= until {
                return;
            }
            if !self.renew || valid_until >= until {
                tokio::time::sleep_until(until.into()).await;
                return;
            }
            let next = crate::backend::deadline::saturating_add(now, lease.ttl / 3).min(until);
            tokio::time::sleep_until(next.into()).await;
            if Instant::now() >= until {
                return;
            }
            let answer = renew_on(&*self.backend, self.kind, std::slice::from_ref(&lease)).await;
            match answer.into_iter().next() {
                Some(Ok(Renewal::Renewed { valid_until })) => {
                    self.lock_state().lease.valid_until = valid_until;
                }
                // Unknown: try again at the next third, while it lasts.
                Some(Err(_)) if lease_now(&lease) < valid_until => {}
                // Gone, or lapsed: the release says so (NotHeld, not logged).
                _ => return,
            }
        }
    }

    /// The compare-and-delete, handing the turn on after its first poll.
    async fn release_now(self: Arc<Self>, was_held: bool) -> Result<(), LockError> {
        let lease = self.lock_state().lease.clone();
        let mut release = std::pin::pin!(release_on(&*self.backend, self.kind, &lease));
        let mut first_poll = true;
        let answer = std::future::poll_fn(|cx| {
            let answer = release.as_mut().poll(cx);
            // After the first poll the request is sent (or queued to be).
            if std::mem::take(&mut first_poll) {
                self.give_up_turns();
            }
            answer
        })
        .await;
        match answer {
            Ok(true) if was_held => Ok(()),
            Ok(_) => Err(LockError::NotHeld {
                key: self.key.clone(),
            }),
            Err(e) => Err(e),
        }
    }
}

/// Logs a background release that failed for another reason than a lease
/// already gone.
fn report_background(result: Result<(), LockError>) {
    if let Err(e) = result
        && !matches!(e, LockError::NotHeld { .. })
    {
        tracing::warn!(error = %e, "background release failed; the lease will expire by its ttl");
    }
}

/// A release task that was dropped before it finished (its runtime is gone
/// or shutting down) finishes on dlock's background runtime.
struct ReleaseElsewhere(Option<(Arc<LeaseShared>, bool)>);

impl ReleaseElsewhere {
    /// The release finished where it was queued.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for ReleaseElsewhere {
    fn drop(&mut self) {
        if let Some((shared, was_held)) = self.0.take() {
            crate::lease::background::spawn(async move {
                report_background(shared.finish_release(was_held).await);
            });
        }
    }
}

/// Renews `leases`, all of one kind, through the backend call for it.
pub(crate) async fn renew_on(
    backend: &dyn LockBackend,
    kind: LeaseKind,
    leases: &[Lease],
) -> Vec<Result<Renewal, LockError>> {
    match kind {
        LeaseKind::Lock => backend.renew(leases).await,
        LeaseKind::Permit => match backend.permits() {
            Some(permits) => permits.renew_permits(leases).await,
            // Not on a backend that granted the permit; answered all the same.
            None => refuse_all(leases, || no_semaphores(&backend.describe())),
        },
        LeaseKind::Rw(mode) => match backend.rw() {
            Some(rw) => rw.renew_rw(mode, leases).await,
            None => refuse_all(leases, || no_rw_locks(&backend.describe())),
        },
        LeaseKind::Member => match backend.barrier() {
            Some(barriers) => barriers.renew_members(leases).await,
            None => refuse_all(leases, || no_barriers(&backend.describe())),
        },
    }
}

/// One error per lease, for a batch no backend call can answer.
fn refuse_all(leases: &[Lease], error: impl Fn() -> LockError) -> Vec<Result<Renewal, LockError>> {
    leases.iter().map(|_| Err(error())).collect()
}

/// Gives `lease` back through the backend call for its kind.
pub(crate) async fn release_on(
    backend: &dyn LockBackend,
    kind: LeaseKind,
    lease: &Lease,
) -> Result<bool, LockError> {
    match kind {
        LeaseKind::Lock => backend.release(lease).await,
        LeaseKind::Permit => match backend.permits() {
            Some(permits) => permits.release_permit(lease).await,
            None => Err(no_semaphores(&backend.describe())),
        },
        LeaseKind::Rw(mode) => match backend.rw() {
            Some(rw) => rw.release_rw(mode, lease).await,
            None => Err(no_rw_locks(&backend.describe())),
        },
        LeaseKind::Member => match backend.barrier() {
            Some(barriers) => barriers.remove_member(lease).await,
            None => Err(no_barriers(&backend.describe())),
        },
    }
}
