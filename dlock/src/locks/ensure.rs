//! `ensure()`: the synchronous "is my lease still valid right now" check a
//! holder makes right before each side effect.
//!
//! It reads only local state (the lease's status and its local deadline,
//! the conservative one: counted from when the request that took or last
//! renewed the lease was sent, less the drift margin), so it costs a mutex
//! and a clock read, never a round trip. It catches what `lost()` reports a
//! moment later: a process resumed after a pause (SIGSTOP, a stopped VM, a
//! long GC) past its deadline runs its next line before the watchdog has
//! had a chance to mark the lease lost, and `ensure()` on that line refuses.

use crate::lease::held::LeaseShared;
use crate::locks::election::Leadership;
use crate::locks::multi_guard::MultiGuard;
use crate::locks::semaphore::Permit;
use crate::{LockError, LockGuard};

/// The refusal: a DEBUG event (the loss itself is the WARN "lease lost"
/// event and `dlock_lost_total`, once), and the error naming `key`.
fn refused(key: &str, lease: &LeaseShared) -> LockError {
    tracing::debug!(
        key = %key,
        fence = ?lease.fencing_token,
        backend = %lease.label(),
        "ensure refused: the lease is lost or past its local deadline"
    );
    LockError::Lost {
        key: key.to_owned(),
    }
}

impl LockGuard {
    /// `Ok(())` if the lease is still held right now; `Err(LockError::Lost)`
    /// once it is lost, released, or past its local deadline. Synchronous
    /// and cheap (no request to the service): call it right before each
    /// side effect the lock protects, and send the
    /// [`fencing_token`](Self::fencing_token) with the write as well.
    ///
    /// The deadline is the conservative local one, renewed by every
    /// successful renewal: a process that was paused past it (a stopped VM,
    /// SIGSTOP, a long GC pause) is refused here on its first line after
    /// the resume, before [`lost`](Self::lost) has had the chance to fire.
    /// It cannot refuse a write that is already on its way: that is the
    /// fencing token's job, so do both.
    ///
    /// # Errors
    /// [`LockError::Lost`] naming the key.
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::connect("memory://").await?;
    /// let guard = dlock::Lock::new("report").ttl(Duration::from_millis(100)).renew(false)
    ///     .with_backend(backend).acquire().await?;
    /// guard.ensure()?; // held: write now, with guard.fencing_token()
    /// std::thread::sleep(Duration::from_millis(150)); // as a pause past the ttl would
    /// assert!(matches!(guard.ensure(), Err(dlock::LockError::Lost { .. })));
    /// # Ok(()) }
    /// ```
    pub fn ensure(&self) -> Result<(), LockError> {
        if self.is_held() {
            Ok(())
        } else {
            Err(refused(self.key(), self.lease()))
        }
    }
}

impl MultiGuard {
    /// `Ok(())` if every key's lease is held right now; else
    /// `Err(LockError::Lost)` naming the first key that is not: see
    /// [`LockGuard::ensure`].
    ///
    /// # Errors
    /// [`LockError::Lost`] naming a key whose lease is lost or past its
    /// local deadline.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let guard = dlock::MultiLock::new(["a", "b"]).with_backend(backend.clone())
    ///     .ttl(std::time::Duration::from_millis(300)).acquire().await?;
    /// guard.ensure()?;
    /// backend.force_expire("b"); // as an operator's DEL would
    /// tokio::time::timeout(std::time::Duration::from_secs(5), guard.lost()).await.unwrap();
    /// assert!(matches!(guard.ensure(), Err(dlock::LockError::Lost { key }) if key == "b"));
    /// # Ok(()) }
    /// ```
    pub fn ensure(&self) -> Result<(), LockError> {
        self.guards().iter().try_for_each(LockGuard::ensure)
    }
}

impl Permit {
    /// `Ok(())` if the permit is held right now; else
    /// `Err(LockError::Lost)` naming the semaphore: see
    /// [`LockGuard::ensure`].
    ///
    /// # Errors
    /// [`LockError::Lost`] once the permit's lease is lost or past its
    /// local deadline.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::connect("memory://").await?;
    /// let permit = dlock::Semaphore::new("exports", 3).with_backend(backend).acquire().await?;
    /// permit.ensure()?; // start the export
    /// # Ok(()) }
    /// ```
    pub fn ensure(&self) -> Result<(), LockError> {
        self.lease_guard().ensure()
    }
}

impl Leadership {
    /// `Ok(())` if this process still leads right now; else
    /// `Err(LockError::Lost)` naming the election: see
    /// [`LockGuard::ensure`]. Call it right before each act of the leader,
    /// and send the [`term`](Self::term) with every write.
    ///
    /// # Errors
    /// [`LockError::Lost`] once the leadership's lease is lost, past its
    /// local deadline, or resigned.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::connect("memory://").await?;
    /// let leadership = dlock::Election::new("scheduler").with_backend(backend).campaign("node-a").await?;
    /// leadership.ensure()?; // act as the leader, with leadership.term()
    /// # Ok(()) }
    /// ```
    pub fn ensure(&self) -> Result<(), LockError> {
        match self.lease_guard() {
            Some(guard) => guard.ensure().map_err(|_| LockError::Lost {
                key: self.name().to_owned(),
            }),
            None => Err(LockError::Lost {
                key: self.name().to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::backends::memory::MemoryBackend;
    use crate::{Election, Lock, LockError, MultiLock, RwLock, Semaphore};

    const SHORT: Duration = Duration::from_millis(60);

    /// Blocks the thread past `SHORT`: a pause the code did not see coming.
    /// (The watchdog runs on its own thread, so the leases under test have
    /// renewal off: their deadline passes as a paused process's would.)
    fn pause_past_the_ttl() {
        std::thread::sleep(SHORT * 2);
    }

    fn is_lost(result: Result<(), LockError>, name: &str) -> bool {
        matches!(result, Err(LockError::Lost { key }) if key == name)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lock_past_its_deadline_is_refused() {
        let backend = Arc::new(MemoryBackend::new());
        let guard = Lock::new("paused")
            .ttl(SHORT)
            .renew(false)
            .with_backend(backend)
            .acquire()
            .await
            .unwrap();
        guard.ensure().unwrap();
        pause_past_the_ttl();
        // Whether or not the watchdog has marked it lost yet.
        assert!(is_lost(guard.ensure(), "paused"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_renewed_lock_stays_valid() {
        let backend = Arc::new(MemoryBackend::new());
        let guard = Lock::new("renewed")
            .ttl(SHORT)
            .with_backend(backend)
            .acquire()
            .await
            .unwrap();
        // Several ttls, with the runtime free to renew.
        tokio::time::sleep(SHORT * 4).await;
        guard.ensure().unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_known_loss_is_refused() {
        let backend = Arc::new(MemoryBackend::new());
        let guard = Lock::new("deleted")
            .ttl(Duration::from_millis(300))
            .with_backend(backend.clone())
            .acquire()
            .await
            .unwrap();
        backend.force_expire("deleted");
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .unwrap();
        assert!(is_lost(guard.ensure(), "deleted"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn every_guard_kind_refuses_after_a_pause() {
        let backend = Arc::new(MemoryBackend::new());
        let multi = MultiLock::new(["m:a", "m:b"])
            .ttl(SHORT)
            .renew(false)
            .with_backend(backend.clone())
            .acquire()
            .await
            .unwrap();
        let permit = Semaphore::new("exports", 2)
            .ttl(SHORT)
            .renew(false)
            .with_backend(backend.clone())
            .acquire()
            .await
            .unwrap();
        let read = RwLock::new("prices")
            .ttl(SHORT)
            .renew(false)
            .with_backend(backend.clone())
            .read()
            .await
            .unwrap();
        let leadership = Election::new("scheduler")
            .ttl(SHORT)
            .renew(false)
            .with_backend(backend.clone())
            .campaign("node-a")
            .await
            .unwrap();
        multi.ensure().unwrap();
        permit.ensure().unwrap();
        read.ensure().unwrap();
        leadership.ensure().unwrap();
        pause_past_the_ttl();
        assert!(is_lost(multi.ensure(), "m:a"));
        assert!(is_lost(permit.ensure(), "exports"));
        assert!(is_lost(read.ensure(), "prices"));
        assert!(is_lost(leadership.ensure(), "scheduler"));
    }
}
