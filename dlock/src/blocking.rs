//! The synchronous API, for programs without an async runtime:
//! [`connect_blocking`], [`Lock::acquire_blocking`],
//! [`Lock::try_acquire_blocking`] and [`LockGuard::release_blocking`]. Each runs its async twin on dlock's
//! background runtime (the one that renews every lease) and waits for it on
//! the calling thread, so the lease is renewed while that thread does
//! anything at all, sleeping included.

use std::future::Future;

use std::sync::Arc;

use crate::{Lock, LockBackend, LockError, LockGuard};

/// [`connect`](crate::connect) for synchronous code: connects to the lock
/// service at `url` on dlock's background runtime (where the connection
/// lives in any case) and waits for it on the calling thread.
///
/// # Errors
/// As [`connect`](crate::connect); and [`LockError::InvalidOption`] when
/// called inside an async runtime (use `connect(url).await` there).
///
/// ```
/// // A plain `main`: no async runtime anywhere.
/// let backend = dlock::connect_blocking("memory://")?;
/// let guard = dlock::Lock::new("migration").with_backend(backend).acquire_blocking()?;
/// guard.release_blocking()?;
/// # Ok::<(), dlock::LockError>(())
/// ```
pub fn connect_blocking(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    let url = url.to_owned();
    block_on("connect", async move { crate::connect(&url).await })
}

/// Runs `work` on dlock's background runtime and waits for its output.
///
/// Refused inside an async runtime: blocking one of its threads would stall
/// its other tasks (and, on a current-thread runtime, the very work waited
/// for).
fn block_on<T: Send + 'static>(
    what: &str,
    work: impl Future<Output = Result<T, LockError>> + Send + 'static,
) -> Result<T, LockError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(LockError::invalid_option(format!(
            "`{what}_blocking` was called inside an async runtime, whose thread it would block; use `{what}().await` there (or call it from a plain thread)"
        )));
    }
    let Some(runtime) = crate::lease::background::handle()? else {
        return Err(LockError::backend(
            "dlock",
            "dlock's background runtime could not be started, so the blocking API cannot run",
        ));
    };
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    drop(runtime.spawn(async move {
        let _ = tx.send(work.await);
    }));
    rx.recv().unwrap_or_else(|_| {
        Err(LockError::backend(
            "dlock",
            format!("`{what}_blocking` was dropped unfinished on dlock's background runtime"),
        ))
    })
}

impl Lock {
    /// [`acquire`](Lock::acquire) for synchronous code: blocks the calling
    /// thread until the lock is held or the wait runs out.
    ///
    /// The lease is renewed by dlock's background thread while the guard
    /// lives, whatever the calling thread does; dropping the guard releases
    /// it in the background, [`release_blocking`](LockGuard::release_blocking)
    /// releases it before returning.
    ///
    /// # Errors
    /// As [`acquire`](Lock::acquire); and [`LockError::InvalidOption`] when
    /// called inside an async runtime (use `acquire().await` there).
    ///
    /// ```
    /// use std::time::Duration;
    /// // A plain `main`: no async runtime anywhere.
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let lock = dlock::Lock::new("nightly").ttl(Duration::from_millis(300)).with_backend(backend);
    /// let guard = lock.acquire_blocking()?;
    /// std::thread::sleep(Duration::from_millis(700)); // longer than the ttl: renewed meanwhile
    /// assert!(guard.is_held());
    /// assert!(lock.try_acquire_blocking()?.is_none());
    /// guard.release_blocking()?;
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn acquire_blocking(&self) -> Result<LockGuard, LockError> {
        let lock = self.clone();
        block_on("acquire", async move { lock.acquire().await })
    }

    /// [`try_acquire`](Lock::try_acquire) for synchronous code: one attempt,
    /// `Ok(None)` if someone else holds the lock.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Lock::acquire_blocking), but never `Busy` or
    /// `Timeout`.
    ///
    /// ```
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let lock = dlock::Lock::new("once").with_backend(backend);
    /// let guard = lock.try_acquire_blocking()?.expect("free");
    /// assert!(lock.try_acquire_blocking()?.is_none());
    /// # drop(guard); Ok::<(), dlock::LockError>(())
    /// ```
    pub fn try_acquire_blocking(&self) -> Result<Option<LockGuard>, LockError> {
        let lock = self.clone();
        block_on("try_acquire", async move { lock.try_acquire().await })
    }
}

impl LockGuard {
    /// [`release`](LockGuard::release) for synchronous code: gives the
    /// lease back and returns when the service answered.
    ///
    /// # Errors
    /// As [`release`](LockGuard::release); and
    /// [`LockError::InvalidOption`] inside an async runtime (the guard is
    /// then dropped, which releases in the background).
    ///
    /// ```
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let guard = dlock::Lock::new("job").with_backend(backend.clone()).acquire_blocking()?;
    /// guard.release_blocking()?;
    /// assert!(backend.holder("job").is_none());
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn release_blocking(self) -> Result<(), LockError> {
        block_on("release", self.release())
    }
}
