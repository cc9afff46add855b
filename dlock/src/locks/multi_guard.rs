//! `MultiGuard`: the held keys of a [`MultiLock`](crate::MultiLock), their
//! fences, their loss, their scope and their release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use crate::{LockError, LockGuard};

/// Every key of a [`MultiLock`](crate::MultiLock), held: one [`LockGuard`]
/// per key, in canonical order.
///
/// Each lease is renewed by the watchdog like any lock's; the guard is held
/// while all of them are. [`lost`](Self::lost) fires when any of them is
/// lost. Dropping the guard releases every key in the background;
/// [`release`](Self::release) releases them now.
///
/// ```
/// use dlock::MultiLock;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://").await?;
/// let guard = MultiLock::new(["account:7", "account:3"]).with_backend(backend).acquire().await?;
/// assert!(guard.is_held());
/// for (key, fence) in guard.fencing_tokens() {
///     println!("write to {key} with fence {fence:?}"); // one fence per key
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the keys are released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct MultiGuard {
    /// One guard per key, in canonical order.
    guards: Vec<LockGuard>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("guards", &self.guards)
            .finish()
    }
}

impl MultiGuard {
    pub(crate) fn new(guards: Vec<LockGuard>) -> Self {
        MultiGuard { guards }
    }

    /// The held keys, in canonical order (sorted, without duplicates).
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.guards.iter().map(LockGuard::key)
    }

    /// Each key's guard, in canonical order (its token, fence, `lost()`).
    /// This `MultiGuard` owns them: release through it.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Each key with its fencing token (see
    /// [`LockGuard::fencing_token`]): tokens count per key, so a write to a
    /// key's storage carries that key's token. `None` where the backend
    /// cannot fence (Redlock).
    pub fn fencing_tokens(&self) -> Vec<(&str, Option<u64>)> {
        self.guards
            .iter()
            .map(|g| (g.key(), g.fencing_token()))
            .collect()
    }

    /// True while every key's lease is held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any key's lease is lost; never resolves if all are
    /// released first. `'static`, like [`LockGuard::lost`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let guard = dlock::MultiLock::new(["a", "b"]).with_backend(backend.clone())
    ///     .ttl(std::time::Duration::from_millis(300)).acquire().await?;
    /// backend.force_expire("b"); // as an operator's DEL of one key would
    /// tokio::time::timeout(std::time::Duration::from_secs(5), guard.lost())
    ///     .await
    ///     .expect("losing one key is losing the multi-lock");
    /// assert!(!guard.is_held());
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let mut each: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = self
            .guards
            .iter()
            .map(|g| Box::pin(g.lost()) as Pin<Box<dyn Future<Output = ()> + Send>>)
            .collect();
        std::future::poll_fn(move |cx| {
            if each
                .iter_mut()
                .any(|lost| lost.as_mut().poll(cx).is_ready())
            {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Runs `work` inside the critical section of every key: a
    /// [`Lock`](crate::Lock) (or another `MultiLock`) on any of these keys,
    /// on the same backend, acquired inside `work` re-enters at once, as in
    /// [`LockGuard::scope`]. This is what a `#[distributed_lock(keys = ..)]`
    /// body runs in.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::connect("memory://").await?;
    /// let guard = dlock::MultiLock::new(["a", "b"]).with_backend(backend.clone()).acquire().await?;
    /// let one = dlock::Lock::new("b").with_backend(backend);
    /// assert!(one.try_acquire().await?.is_none()); // outside the scope: held
    /// let inner = guard.scope(one.try_acquire()).await?.expect("re-enters inside the scope");
    /// assert!(inner.is_reentrant());
    /// # Ok(()) }
    /// ```
    pub fn scope<F: Future>(&self, work: F) -> impl Future<Output = F::Output> + use<F> {
        let leases = self.guards.iter().map(|g| g.lease().clone()).collect();
        crate::locks::scope::inside_all(leases, work)
    }

    /// Releases every key now, last taken first; a failure on one key does
    /// not stop the others.
    ///
    /// # Errors
    /// The first error: [`LockError::NotHeld`] if a key's lease was lost,
    /// [`LockError::Backend`] if the service failed (that lease then expires
    /// after its ttl).
    ///
    /// # Cancel safety
    /// If this future is dropped, the keys not yet released are released
    /// in the background.
    pub async fn release(self) -> Result<(), LockError> {
        let mut first = Ok(());
        for guard in self.guards.into_iter().rev() {
            let released = guard.release().await;
            if first.is_ok() {
                first = released;
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::memory::MemoryBackend;
    use std::sync::Arc;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn guard_is_send_sync() {
        assert_send_sync::<MultiGuard>();
    }

    /// One key lost behind the holder's back: `release` reports it, and
    /// still releases the keys before and after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn release_reports_the_first_error_and_releases_the_rest() {
        let backend = Arc::new(MemoryBackend::new());
        let guard = crate::MultiLock::new(["r:a", "r:b", "r:c"])
            .with_backend(backend.clone())
            .acquire()
            .await
            .unwrap();
        assert!(backend.force_expire("r:b"));
        match guard.release().await {
            Err(LockError::NotHeld { key }) => assert_eq!(&*key, "r:b"),
            other => panic!("expected NotHeld on r:b, got {other:?}"),
        }
        for key in ["r:a", "r:b", "r:c"] {
            assert!(backend.holder(key).is_none(), "{key} is still held");
        }
    }
}
