//! `LockGuard`: the user's handle on a held lease, its lost signal, release
//! and drop.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::lease::acquire::Taken;
use crate::lease::held::LeaseShared;
use crate::lease::observe::HeldKey;
use crate::lease::queue::Turn;
use crate::lease::watchdog::Watchdog;
use crate::LockError;

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
#[clippy::has_significant_drop]
pub struct LockGuard {
    shared: Arc<LeaseShared>,
    /// The watchdog that renews the lease, for the guard that took it;
    /// `None` for a reentrant guard, which neither renews nor releases: the
    /// outer guard does.
    watchdog: Option<Arc<Watchdog>>,
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
            .field("reentrant", &self.is_reentrant())
            .field("segment", &self.segment)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl HeldKey for LockGuard {
    fn held_key(&self) -> &str {
        self.key()
    }

    fn held_fence(&self) -> Option<u64> {
        self.fencing_token()
    }
}

impl From<Taken> for LockGuard {
    fn from(taken: Taken) -> Self {
        LockGuard::outer(taken.shared, taken.watchdog)
    }
}

impl LockGuard {
    /// The guard of a lease just taken, which `watchdog` watches.
    pub(crate) fn outer(shared: Arc<LeaseShared>, watchdog: Arc<Watchdog>) -> Self {
        LockGuard {
            shared,
            watchdog: Some(watchdog),
            done: false,
            segment: None,
        }
    }

    /// A guard that shares the lease of the guard whose scope it runs in.
    pub(crate) fn reentrant(shared: Arc<LeaseShared>) -> Self {
        LockGuard {
            shared,
            watchdog: None,
            done: false,
            segment: None,
        }
    }

    /// The part of a release that cannot wait (see
    /// [`LeaseShared::begin_release`]), and the watchdog lets the lease go.
    /// `None` for a reentrant guard.
    fn begin_release(&self) -> Option<Result<bool, ()>> {
        let watchdog = self.watchdog.as_ref()?;
        let began = self.shared.begin_release();
        if began.is_ok() {
            watchdog.deregister(&self.shared);
        }
        Some(began)
    }

    /// The lease this guard holds (or shares, when reentrant).
    pub(crate) fn lease(&self) -> &Arc<LeaseShared> {
        &self.shared
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

    /// The owner token: at least 128 random bits from the OS, hex encoded;
    /// for a lock lease, followed by `@` and the backend's client name (what
    /// [`Lock::inspect`](crate::Lock::inspect) shows as the holder). The
    /// server stores it, and only this token can renew or release.
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
        self.watchdog.is_none()
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
    pub fn scope<F: Future>(&self, work: F) -> impl Future<Output = F::Output> + use<F> {
        crate::locks::scope::inside(self.shared.clone(), work)
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
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
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
        let Some(began) = self.begin_release() else {
            // Reentrant: the outer guard releases.
            return if self.shared.is_held() {
                Ok(())
            } else {
                Err(LockError::NotHeld {
                    key: self.shared.key.clone(),
                })
            };
        };
        let Ok(was_held) = began else {
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
        if self.done {
            return;
        }
        if let Some(Ok(was_held)) = self.begin_release() {
            self.shared.clone().finish_in_background(was_held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Lease, LockBackend};
    use std::time::Instant;

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
