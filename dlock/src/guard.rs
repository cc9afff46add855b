//! `LockGuard`: a held lease, its lost signal, release and drop.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use tracing::Instrument;

use crate::backend::{Lease, LockBackend};
use crate::local::{BackendLocal, Turn};
use crate::observe::{self, Holding, LossReason};
use crate::LockError;

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Held,
    Released,
    Lost,
}

/// What a lease is a lease on: it decides which backend calls renew and
/// release it (see [`LockBackend`]'s "Semaphores" section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// A lock key: `renew` / `release`.
    Lock,
    /// One permit of a semaphore: `renew_permits` / `release_permit`.
    Permit,
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
    pub(crate) local: Arc<BackendLocal>,
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
    pub(crate) local: Arc<BackendLocal>,
    pub(crate) lease: Lease,
    pub(crate) renew: bool,
    pub(crate) kind: LeaseKind,
    pub(crate) turn: Turn,
    /// The `backend` label operators see (a registered name or a scheme).
    pub(crate) label: Arc<str>,
    /// The `kind` label: a lock, a segment or a permit.
    pub(crate) observed: observe::Kind,
}

impl LeaseShared {
    pub(crate) fn new(parts: NewLease) -> Arc<Self> {
        let lease = parts.lease;
        let next_renew = crate::deadline::saturating_add(Instant::now(), lease.ttl / 3);
        Arc::new(LeaseShared {
            backend: parts.backend,
            local: parts.local,
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
        state.status == Status::Held && Instant::now() < state.lease.valid_until
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

    /// The part of a release that cannot wait: stop renewing, forget the
    /// reentrancy holder. Returns whether the lease was still held.
    fn begin_release(self: &Arc<Self>) -> Result<bool, ()> {
        let was = {
            let mut state = self.lock_state();
            let was = state.status;
            if was == Status::Released {
                return Err(());
            }
            let expired = Instant::now() >= state.lease.valid_until;
            state.status = Status::Released;
            if was == Status::Held {
                self.holding.end();
            }
            was == Status::Held && !expired
        };
        self.local.watchdog.deregister(self);
        Ok(was)
    }

    /// Queues [`finish_release`](Self::finish_release) to the runtime the
    /// lease was acquired on. Never blocks and never panics. If that runtime
    /// is gone or shuts down before the release is done, the task is dropped
    /// there, and the release runs on dlock's background runtime instead:
    /// the backend's connection may well live on a runtime that still runs
    /// (and on etcd and ZooKeeper, a key on a shared session would otherwise
    /// outlive its ttl).
    fn finish_in_background(self: Arc<Self>, was_held: bool) {
        let runtime = self.runtime.clone();
        let mut elsewhere = ReleaseElsewhere(Some((self, was_held)));
        drop(runtime.spawn(async move {
            if let Some((shared, was_held)) = elsewhere.0.clone() {
                report_background(shared.finish_release(was_held).await);
            }
            elsewhere.disarm();
        }));
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
    async fn finish_release(self: Arc<Self>, was_held: bool) -> Result<(), LockError> {
        let span = observe::release_span(&self.key, &self.holding.backend, self.holding.kind);
        let result = self.send_release(was_held).instrument(span.clone()).await;
        observe::released(&span, &result);
        result
    }

    /// The release itself, handing the turn on after its first poll.
    async fn send_release(self: Arc<Self>, was_held: bool) -> Result<(), LockError> {
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
    if let Err(e) = result {
        if !matches!(e, LockError::NotHeld { .. }) {
            tracing::warn!(error = %e, "background release failed; the lease will expire by its ttl");
        }
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
            crate::background::spawn(async move {
                report_background(shared.finish_release(was_held).await);
            });
        }
    }
}

/// Gives `lease` back through the backend call for its kind.
pub(crate) async fn release_on(
    backend: &dyn LockBackend,
    kind: LeaseKind,
    lease: &Lease,
) -> Result<bool, LockError> {
    match kind {
        LeaseKind::Lock => backend.release(lease).await,
        LeaseKind::Permit => backend.release_permit(lease).await,
    }
}

/// A held lock: the lease lives while the guard lives.
///
/// - A background watchdog renews the lease every ttl/3 (unless renewal is off).
/// - [`LockGuard::lost`] resolves if the lease is lost: renewal refused, or
///   the service unreachable until the lease could have expired.
/// - [`LockGuard::release`] gives the lease back now; dropping the guard
///   gives it back in the background on the runtime it was acquired on, or,
///   if that runtime is gone, on a small runtime of dlock's own. If the
///   service cannot be reached, the lease expires after its ttl.
///
/// An acquisition of the same key made inside [`LockGuard::scope`] (and
/// inside a `#[distributed_lock]` body) is reentrant: its guard shares this
/// guard's lease, and dropping or releasing it does not release the lease.
///
/// # Example
///
/// ```
/// use dlock::Lock;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://").await?;
/// let guard = Lock::new("order:42").with_backend(backend).acquire().await?;
/// assert_eq!(guard.key(), "order:42");
/// assert!(guard.is_held());
/// let fence = guard.fencing_token(); // send this with every write the lock protects
/// assert!(fence.is_some());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    shared: Arc<LeaseShared>,
    /// Reentrant guards neither renew nor release: the outer guard does.
    reentrant: bool,
    /// `release()` already ran; `Drop` has nothing to do.
    done: bool,
    /// Which segment of a [`SegmentedLock`](crate::SegmentedLock) this is.
    segment: Option<usize>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.shared.key)
            .field("fencing_token", &self.shared.fencing_token)
            .field("reentrant", &self.reentrant)
            .field("segment", &self.segment)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn outer(shared: Arc<LeaseShared>) -> Self {
        LockGuard {
            shared,
            reentrant: false,
            done: false,
            segment: None,
        }
    }

    pub(crate) fn reentrant(shared: Arc<LeaseShared>) -> Self {
        LockGuard {
            shared,
            reentrant: true,
            done: false,
            segment: None,
        }
    }

    /// Marks this guard as holding segment `index` of a segmented lock.
    pub(crate) fn in_segment(mut self, index: usize) -> Self {
        self.segment = Some(index);
        self
    }

    /// Keeps a segmented lock's local admission (one of N places per key in
    /// this process) with the lease, to be given back with it.
    pub(crate) fn admitted(self, admission: Turn) -> Self {
        self.shared.keep_turn(admission);
        self
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The owner token: at least 128 random bits from the OS, hex encoded.
    /// The server stores it, and only this token can renew or release.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// A number that strictly increases per key across successive holders.
    ///
    /// Pass it with every write the lock protects and let the storage reject
    /// writes with a smaller token than it has seen: that keeps a holder that
    /// paused past its lease (GC, swap, a stopped VM) from doing harm.
    /// `None` only where the backend cannot give one honestly (Redlock).
    pub fn fencing_token(&self) -> Option<u64> {
        self.shared.fencing_token
    }

    /// True while the lease is held: not released, not lost, and its local
    /// deadline not passed.
    pub fn is_held(&self) -> bool {
        !self.done && self.shared.is_held()
    }

    /// Which segment this guard holds, for a guard of a
    /// [`SegmentedLock`](crate::SegmentedLock) (`0..segments`); `None` for a
    /// plain [`Lock`](crate::Lock).
    ///
    /// The guard's [`key`](Self::key) is the segment's own key,
    /// `<key>#<segment>`, and its fencing token counts per segment.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::connect("memory://").await?;
    /// let guard = dlock::SegmentedLock::new("stock:10001", 5).with_backend(backend).acquire_segment(3).await?;
    /// assert_eq!(guard.segment(), Some(3));
    /// assert_eq!(guard.key(), "stock:10001#3");
    /// # Ok(()) }
    /// ```
    pub fn segment(&self) -> Option<usize> {
        self.segment
    }

    /// Whether this guard came from a reentrant acquisition inside the
    /// critical section of a guard that holds the key (it shares that
    /// guard's lease).
    pub fn is_reentrant(&self) -> bool {
        self.reentrant
    }

    /// Runs `work` inside this guard's critical section: an acquisition of
    /// the same key on the same backend made anywhere inside `work` (also in
    /// functions it calls, and in `join!` branches within it) re-enters at
    /// once, without a round trip, and gets a guard that shares this lease.
    ///
    /// This is what a `#[distributed_lock]` body does; use it with the plain
    /// API. Outside `work`, nothing re-enters: another task, a sibling
    /// branch of a `join!` or `select!` that is not inside `work`, or a
    /// second `acquire` after this one in the same code all wait for the
    /// lease like any other caller, as a non-reentrant mutex (tokio's
    /// `Mutex`) makes them. A `tokio::spawn`ed task is not inside `work`
    /// even when spawned from it.
    ///
    /// Once the lease is lost or released, acquisitions inside `work` no
    /// longer re-enter: they contend as any other caller.
    ///
    /// ```
    /// use dlock::Lock;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::connect("memory://").await?;
    /// let lock = Lock::new("order:42").with_backend(backend);
    /// let guard = lock.acquire().await?;
    /// // Outside the scope: a second acquire is not reentrant, the key is held.
    /// assert!(lock.try_acquire().await?.is_none());
    /// guard
    ///     .scope(async {
    ///         let inner = lock.try_acquire().await?.expect("re-enters inside the scope");
    ///         assert!(inner.is_reentrant());
    ///         Ok::<_, dlock::LockError>(())
    ///     })
    ///     .await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn scope<F: Future>(&self, work: F) -> impl Future<Output = F::Output> {
        crate::scope::inside(self.shared.clone(), work)
    }

    /// Resolves when the lease is lost; never resolves if it is released first.
    ///
    /// The future is `'static`: hand it to a `select!` that guards work
    /// running elsewhere.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let guard = dlock::Lock::new("job").with_backend(backend.clone())
    ///     .ttl(std::time::Duration::from_millis(300)).acquire().await?;
    /// backend.force_expire("job"); // as an operator's DEL would
    /// tokio::select! {
    ///     _ = guard.lost() => println!("lost the lock: stop writing"),
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => unreachable!(),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.shared.lost.clone().cancelled_owned()
    }

    /// Gives the lease back now (compare-and-delete on the server).
    ///
    /// On a reentrant guard this only ends the inner scope: the outer guard
    /// still holds the lease.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] if the lease was lost or had expired;
    /// [`LockError::Backend`] if the service failed (the lease then expires
    /// after its ttl).
    ///
    /// # Cancel safety
    /// If this future is dropped, the lease is still released in the background.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.done = true;
        if self.reentrant {
            return if self.shared.is_held() {
                Ok(())
            } else {
                Err(LockError::NotHeld {
                    key: self.shared.key.clone(),
                })
            };
        }
        let Ok(was_held) = self.shared.begin_release() else {
            return Err(LockError::NotHeld {
                key: self.shared.key.clone(),
            });
        };
        // Run inline (no task hop on the hot path); if this future is
        // dropped half-way, the guard below finishes the release in the
        // background.
        let mut unfinished = FinishOnDrop(Some((self.shared.clone(), was_held)));
        let result = self.shared.clone().finish_release(was_held).await;
        unfinished.0 = None;
        result
    }
}

/// Finishes a release whose `release()` future was dropped before the end.
struct FinishOnDrop(Option<(Arc<LeaseShared>, bool)>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let Some((shared, was_held)) = self.0.take() {
            shared.finish_in_background(was_held);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done || self.reentrant {
            return;
        }
        if let Ok(was_held) = self.shared.begin_release() {
            self.shared.clone().finish_in_background(was_held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn guard_is_send_sync() {
        assert_send_sync::<LockGuard>();
    }

    /// A memory backend whose release answers only when the test says so,
    /// as a server whose reply is still on the wire.
    #[derive(Debug)]
    struct SlowReply {
        inner: crate::backends::memory::MemoryBackend,
        replies: tokio::sync::Semaphore,
    }

    #[async_trait::async_trait]
    impl LockBackend for SlowReply {
        fn describe(&self) -> String {
            "slow-reply".into()
        }
        async fn try_acquire(
            &self,
            req: &crate::backend::AcquireRequest,
        ) -> Result<Option<Lease>, LockError> {
            self.inner.try_acquire(req).await
        }
        async fn acquire(
            &self,
            req: &crate::backend::AcquireRequest,
            deadline: Option<Instant>,
        ) -> Result<Option<Lease>, LockError> {
            self.inner.acquire(req, deadline).await
        }
        async fn renew(&self, leases: &[Lease]) -> Vec<Result<crate::backend::Renewal, LockError>> {
            self.inner.renew(leases).await
        }
        async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
            let released = self.inner.release(lease).await;
            // The server has released; its answer waits for the test.
            let _reply = self.replies.acquire().await;
            released
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn next_local_waiter_goes_while_the_release_answer_is_on_its_way() {
        let backend = Arc::new(SlowReply {
            inner: Default::default(),
            replies: tokio::sync::Semaphore::new(0),
        });
        let lock = crate::Lock::new("handoff").with_backend(backend.clone());
        let first = lock.acquire().await.unwrap();
        let first_fence = first.fencing_token().unwrap();
        let waiter = tokio::spawn({
            let lock = lock.clone();
            async move { lock.acquire().await.map(|g| g.fencing_token()) }
        });
        // Let the waiter queue on the local gate.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let releasing = tokio::spawn(first.release());

        let second = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .expect("the waiter still waits for the first release's answer")
            .unwrap()
            .unwrap();
        assert!(second > Some(first_fence));
        assert!(!releasing.is_finished(), "the release answered too early");
        backend.replies.add_permits(1);
        releasing.await.unwrap().unwrap();
    }
}
