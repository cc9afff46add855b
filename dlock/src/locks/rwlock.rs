//! `RwLock`: a read-write lock on a key plus options; `read`, `write` and
//! their one-attempt forms.

use std::fmt;

use crate::backend::RwMode;
use crate::lease::acquire;
use crate::lease::observe::Kind;
use crate::lease::options::{hold_at_least_setter, lease_option_setters, LeaseOptions};
use crate::locks::guard::LockGuard;
use crate::locks::within::rw_within;
use crate::LockError;

/// A distributed read-write lock: any number of readers, or one writer.
///
/// A waiting writer is served before readers that ask after it, in this
/// process and on the server, so a steady stream of readers does not starve
/// writers. Every reader holds a lease of its own with its own ttl: a
/// crashed reader's share frees after its ttl while the others keep theirs.
/// A read-write lock on a key is another object than a [`Lock`](crate::Lock)
/// on the same key: they do not exclude each other.
///
/// [`read`](RwLock::read) and [`write`](RwLock::write) return the same
/// [`LockGuard`] as a mutex: renewed by the watchdog, [`lost`](LockGuard::lost),
/// [`release`](LockGuard::release), released on drop.
///
/// **Fencing**: write guards get strictly increasing tokens per key. A read
/// guard's token places it among the writes: it is at least the token of
/// every write guard granted on the key before the read, and below the
/// token of every write guard granted after it (memory and Redis give the
/// last write's token; etcd and ZooKeeper the read's own revision, which
/// lies between the same writes). A store that keeps the highest write
/// token it has seen can so refuse a write from a writer that lost its
/// lease, and tell a reader whether it reads what the writes before it
/// wrote.
///
/// **Reentrancy**, inside [`LockGuard::scope`] of a guard of this lock on
/// this backend: a write holder's `read` or `write`, and a read holder's
/// `read`, are granted at once and share the holder's lease; a read
/// holder's `write` fails at once with [`LockError::InvalidOption`], as it
/// would wait for its own reader for ever (release the read guard first).
/// Outside a scope, the holder's own code queues like any other caller: a
/// second `read` waits behind a writer that waits for the first, until its
/// `wait` runs out, so nest reads inside [`LockGuard::scope`].
///
/// **Backends**: memory, Redis (single server and Cluster), etcd (the
/// layout of its recipe `RWMutex`) and ZooKeeper (Curator's
/// `InterProcessReadWriteLock` layout); Redlock answers
/// [`LockError::InvalidOption`] naming the backends that have them.
///
/// Options and defaults are [`Lock`](crate::Lock)'s.
///
/// ```
/// use dlock::RwLock;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let prices = RwLock::new("prices:eu").wait(Duration::from_secs(5));
/// let a = prices.read().await?;
/// let b = prices.read().await?;                 // readers share
/// assert!(prices.try_write().await?.is_none()); // a writer waits for them
/// a.release().await?;
/// b.release().await?;
/// let writer = prices.write().await?;
/// assert!(prices.try_read().await?.is_none());  // readers wait for the writer
/// assert!(writer.fencing_token().is_some());
/// writer.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwLock {
    options: LeaseOptions,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.options.fmt(f)
    }
}

impl RwLock {
    /// A read-write lock on `key` with the default options. The key is
    /// checked when a lease is taken ([`LockError::InvalidKey`]).
    pub fn new(key: impl Into<String>) -> Self {
        RwLock {
            options: LeaseOptions::new(key.into()),
        }
    }

    lease_option_setters! {
        ttl: "The lease length of each read or write lease. With renewal on, the
watchdog extends it every ttl/3, so it bounds how long a crashed reader
or writer blocks others; with renewal off it is a hard limit on the
critical section.",
        wait: "How long [`read`](RwLock::read) and [`write`](RwLock::write) may
wait. `Duration::ZERO` makes one attempt and fails with
[`LockError::Busy`]; a wait too long to end (`Duration::MAX`) means no limit.",
        renew: "Renewal by the watchdog (on by default). Off: each lease ends after
    the ttl whatever the holder is doing, and `lost()` fires then.",
    }

    hold_at_least_setter!(type: "RwLock", new: r#"RwLock::new("report:nightly")"#, then: "");

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.options.key
    }

    /// Takes a read (shared) lease, waiting up to the configured `wait`
    /// while a writer holds the key or waits ahead of this reader.
    ///
    /// # Errors
    /// As [`Lock::acquire`](crate::Lock::acquire), and
    /// [`LockError::InvalidOption`] on a backend without read-write locks.
    ///
    /// # Cancel safety
    /// As [`Lock::acquire`](crate::Lock::acquire): dropping the future
    /// leaves nothing behind.
    pub async fn read(&self) -> Result<LockGuard, LockError> {
        self.take(RwMode::Read).await
    }

    /// Takes the write (exclusive) lease, waiting up to the configured
    /// `wait` for the readers and the writer ahead of it.
    ///
    /// # Errors
    /// As [`read`](RwLock::read), and [`LockError::InvalidOption`] when
    /// asked inside the scope of a read guard of this lock (see the type's
    /// reentrancy rules).
    ///
    /// # Cancel safety
    /// As [`read`](RwLock::read).
    pub async fn write(&self) -> Result<LockGuard, LockError> {
        self.take(RwMode::Write).await
    }

    /// One attempt at a read lease that never waits: `Ok(None)` if a writer
    /// holds the key or waits for it.
    ///
    /// # Errors
    /// As [`read`](RwLock::read), but never `Busy` or `Timeout`.
    pub async fn try_read(&self) -> Result<Option<LockGuard>, LockError> {
        self.try_take(RwMode::Read).await
    }

    /// One attempt at the write lease that never waits: `Ok(None)` if any
    /// reader or writer holds the key.
    ///
    /// # Errors
    /// As [`write`](RwLock::write), but never `Busy` or `Timeout`.
    pub async fn try_write(&self) -> Result<Option<LockGuard>, LockError> {
        self.try_take(RwMode::Write).await
    }

    async fn take(&self, mode: RwMode) -> Result<LockGuard, LockError> {
        let kind = observed(mode);
        acquire::acquire(&self.options, kind, |wait| {
            rw_within(&self.options, mode, wait, kind)
        })
        .await
    }

    async fn try_take(&self, mode: RwMode) -> Result<Option<LockGuard>, LockError> {
        let kind = observed(mode);
        acquire::try_acquire(&self.options, kind, |wait| {
            rw_within(&self.options, mode, wait, kind)
        })
        .await
    }
}

/// The `kind` label of a `mode` lease.
fn observed(mode: RwMode) -> Kind {
    match mode {
        RwMode::Read => Kind::Read,
        RwMode::Write => Kind::Write,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::backends::memory::MemoryBackend;
    use crate::{lease::local, Lock, LockBackend};

    fn rw(backend: &Arc<MemoryBackend>, key: &str) -> RwLock {
        RwLock::new(key).with_backend(backend.clone())
    }

    #[tokio::test]
    async fn nested_leases_follow_the_reentrancy_rules() {
        let backend = Arc::new(MemoryBackend::new());
        let lock = rw(&backend, "k").wait(Duration::from_millis(200));
        let writer = lock.write().await.unwrap();
        let (read, write) = writer
            .scope(async { (lock.read().await, lock.write().await) })
            .await;
        let (read, write) = (read.unwrap(), write.unwrap());
        assert!(read.is_reentrant() && write.is_reentrant());
        assert_eq!(read.fencing_token(), writer.fencing_token());
        drop((read, write));
        writer.release().await.unwrap();

        let reader = lock.read().await.unwrap();
        let (read, write) = reader
            .scope(async { (lock.read().await, lock.write().await) })
            .await;
        assert!(read.unwrap().is_reentrant());
        let err = write.unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(err.to_string().contains("`k`"), "{err}");
        // Outside the reader's scope a write waits as any other caller's.
        let err = lock.write().await.unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
        reader.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_lock_and_a_read_write_lock_of_one_key_are_apart() {
        let backend = Arc::new(MemoryBackend::new());
        let writer = rw(&backend, "k").write().await.unwrap();
        let plain = Lock::new("k").with_backend(backend.clone());
        let lock = plain.try_acquire().await.unwrap();
        let lock = lock.expect("the plain lock is another object");
        // Nor does a plain lock's scope re-enter a read-write lock.
        let inside = lock.scope(rw(&backend, "k").try_read()).await.unwrap();
        assert!(inside.is_none(), "the writer holds the read-write lock");
        lock.release().await.unwrap();
        writer.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_local_writer_waits_for_local_readers_and_stops_later_ones() {
        let backend = Arc::new(MemoryBackend::new());
        let lock = rw(&backend, "k");
        let first = lock.read().await.unwrap();
        let writing = tokio::spawn({
            let lock = lock.clone();
            async move { lock.write().await }
        });
        // Until the writer waits in line, a reader may still come in.
        let writer_in_line = async {
            while lock.try_read().await.unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), writer_in_line)
            .await
            .expect("the writer never stopped new readers");
        assert!(!writing.is_finished());
        first.release().await.unwrap();
        let writer = writing.await.unwrap().unwrap();
        assert_eq!(backend.rw_holders("k"), (0, true));
        writer.release().await.unwrap();
    }

    #[tokio::test]
    async fn released_read_write_locks_leave_no_slot() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let local = local::for_backend(&backend);
        for i in 0..20 {
            let lock = RwLock::new(format!("k{i}")).with_backend(backend.clone());
            let (a, b) = (lock.read().await.unwrap(), lock.read().await.unwrap());
            a.release().await.unwrap();
            b.release().await.unwrap();
            lock.write().await.unwrap().release().await.unwrap();
        }
        assert_eq!(local.slot_count(), 0, "a read-write slot was kept");
    }

    #[tokio::test]
    async fn a_backend_without_read_write_locks_says_so_once() {
        let lock = RwLock::new("k").with_backend(Arc::new(crate::locks_only::LocksOnly::default()));
        for err in [
            lock.read().await.unwrap_err(),
            lock.try_write().await.unwrap_err(),
        ] {
            assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
            let text = err.to_string();
            assert!(
                text.contains("locks-only://") && text.contains("memory://"),
                "{text}"
            );
        }
    }
}
