//! The in-process backend (`memory://`): real leases with real expiry, for one process.
//!
//! Capabilities: ✓ mutual exclusion between tasks of one process · ✓ lease
//! expiry · ✓ fencing tokens · ✓ FIFO wake-up of waiters · ✓ semaphores
//! (see `permits.rs`) · ✓ read-write locks (see `rw.rs`) · ✓ leader election
//! (see `election.rs`) · ✓ count-down latches (see `latch.rs`) · ✗ other
//! processes.
//!
//! It is the embedded default of the quickstart and the docs, and what the
//! core's own tests run on. It is not a stand-in for a distributed backend:
//! two processes each have their own map.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use async_trait::async_trait;

// The files of this backend, by concern (what ARCHITECTURE.md's "Inside a backend"
// table points to):
// - waiting in line: `ticket.rs` (+ the nap between tries), `table.rs` (one wait loop: a try
//   under the lock that queues the ticket, then register for the wake-up and try again; and the
//   try, renewal, release and forced removal, for locks, semaphores and read-write locks alike)
// - clean-up of abandoned entries: `ticket.rs`
// - semaphores (`PermitBackend`): `permits.rs`
// - leader election (`ElectionBackend`): `election.rs` (records beside the lock table, a
//   generation per observed election)
// - read-write locks (`RwBackend`): `rw.rs`
// - count-down latches (`LatchBackend`): `latch.rs`
// - double barriers (`BarrierBackend`): `barrier.rs`
mod barrier;
mod election;
mod latch;
mod permits;
mod rw;
mod table;
mod ticket;

use self::ticket::{lock_table, Table};
use self::ticket::{Queued, Waiters};
use crate::backend::deadline::saturating_add;
use crate::backend::{
    lease_deadline, AcquireRequest, Lease, LockBackend, PermitBackend, PermitRequest, Renewal,
    RwBackend, RwMode, RwRequest,
};
use crate::LockError;

/// An in-process lock service: a map of keys to leases with deadlines.
///
/// Every `MemoryBackend` is its own namespace; clones of the `Arc` share it.
///
/// ```
/// use dlock::{backends::memory::MemoryBackend, Lock};
/// use std::{sync::Arc, time::Duration};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let backend = Arc::new(MemoryBackend::new());
/// let guard = Lock::new("job").with_backend(backend.clone()).ttl(Duration::from_secs(5)).acquire().await.unwrap();
/// assert!(backend.holder("job").is_some());
/// guard.release().await.unwrap();
/// assert!(backend.holder("job").is_none());
/// # }
/// ```
#[derive(Debug, Default)]
pub struct MemoryBackend {
    state: Table<KeyState>,
    /// One counter for all keys: strictly increasing per key too, and it lets
    /// idle keys be forgotten without resetting their fencing tokens. Locks
    /// and read-write locks draw from it alike.
    fence: AtomicU64,
    next_ticket: AtomicU64,
    /// The semaphores, apart from the locks: a semaphore and a lock may
    /// share a name.
    permits: permits::PermitTable,
    /// The read-write locks, apart from the locks: a read-write lock and a
    /// lock may share a key.
    rw: rw::RwTable,
    /// The leader elections' records, beside the locks of their names.
    elections: election::ElectionTable,
    /// The count-down latches, apart from the locks: a latch and a lock
    /// may share a name.
    latches: latch::LatchTable,
    /// The double barriers, apart from the locks.
    barriers: barrier::BarrierTable,
    /// `?client_name=`, written into each lock's owner token.
    client_name: Option<String>,
}

#[derive(Debug)]
struct KeyState {
    holder: Option<Holder>,
    /// Waiters in arrival order; only the front may take a free key.
    waiters: Waiters,
}

#[derive(Debug, Clone)]
struct Holder {
    token: String,
    fence: u64,
    /// The server-side expiry, from when the request arrived.
    expires: Instant,
}

impl Queued for KeyState {
    fn new() -> Self {
        KeyState {
            holder: None,
            waiters: Waiters::new(),
        }
    }

    fn waiters(&mut self) -> &mut Waiters {
        &mut self.waiters
    }

    fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires <= now) {
            self.holder = None;
        }
    }

    fn earliest_expiry(&self) -> Option<Instant> {
        self.holder.as_ref().map(|h| h.expires)
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiters.queue.is_empty()
    }
}

impl MemoryBackend {
    /// A new, empty namespace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects to `memory://`: a new, empty namespace.
    /// `?client_name=` names the holder that [`Lock::inspect`](crate::Lock::inspect) shows.
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] if the URL is not a `memory://` URL, or
    /// names a host or a parameter other than `client_name`.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let Some(rest) = url.strip_prefix("memory://") else {
            return Err(LockError::invalid_option(format!(
                "`{}` is not a memory URL; write `memory://`",
                crate::url::redact(url)
            )));
        };
        // Nothing is ignored: the memory backend has no address (it lives
        // in this process), and `client_name` is its one parameter.
        let shown = crate::url::redact(url);
        let (address, query) = rest.split_once('?').unwrap_or((rest, ""));
        if !address.is_empty() && address != "/" {
            return Err(LockError::invalid_option(format!(
                "`{shown}`: the memory backend takes no host (it lives in this process); write `memory://`"
            )));
        }
        let mut backend = Self::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=').unwrap_or((pair, "")) {
                ("client_name", name) => {
                    backend.client_name = Some(crate::backend::holder::check_client_name(name)?);
                }
                (other, _) => {
                    return Err(LockError::invalid_option(format!(
                        "`{shown}`: unknown parameter `{other}`; memory URLs take client_name"
                    )))
                }
            }
        }
        Ok(backend)
    }

    /// The token of the current holder of `key`, if the lease is live.
    pub fn holder(&self, key: &str) -> Option<String> {
        let now = Instant::now();
        let state = lock_table(&self.state);
        let entry = state.get(key)?;
        entry
            .holder
            .as_ref()
            .filter(|h| h.expires > now)
            .map(|h| h.token.clone())
    }

    /// Removes the lease on `key` behind its holder's back, as an operator's
    /// `DEL` would on a server. The holder's next renewal is refused and its
    /// guard reports the loss. Returns whether a lease was removed.
    pub fn force_expire(&self, key: &str) -> bool {
        table::force_remove(&self.state, key, |entry| entry.holder.take().is_some())
    }

    /// How many live permits the semaphore `name` has out.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let permit = dlock::Semaphore::new("exports", 3).with_backend(backend.clone()).acquire().await?;
    /// assert_eq!(backend.permits_held("exports"), 1);
    /// # drop(permit); Ok(()) }
    /// ```
    pub fn permits_held(&self, name: &str) -> usize {
        self.permits.held(name)
    }

    /// How many count-down latches this backend keeps: those with a live
    /// count, and those waited on. A latch at zero that nobody waits on is
    /// forgotten, so a cancelled `wait_zero` leaves nothing here.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let latch = dlock::CountDownLatch::new("shards").with_backend(backend.clone());
    /// latch.try_set_count(1).await?;
    /// assert_eq!(backend.latches_kept(), 1);
    /// latch.count_down().await?;
    /// assert_eq!(backend.latches_kept(), 0);
    /// # Ok(()) }
    /// ```
    pub fn latches_kept(&self) -> usize {
        self.latches.len()
    }

    /// Removes every permit of the semaphore `name` behind its holders'
    /// backs, as an operator's `DEL` would. Their renewals are refused and
    /// their permits report the loss. Returns how many were removed.
    pub fn force_expire_permits(&self, name: &str) -> usize {
        self.permits.force_expire(name)
    }

    /// How many live readers hold the read-write lock `key`, and whether a
    /// live writer does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = std::sync::Arc::new(dlock::backends::memory::MemoryBackend::new());
    /// let reader = dlock::RwLock::new("prices").with_backend(backend.clone()).read().await?;
    /// assert_eq!(backend.rw_holders("prices"), (1, false));
    /// # drop(reader); Ok(()) }
    /// ```
    pub fn rw_holders(&self, key: &str) -> (usize, bool) {
        self.rw.holders(key)
    }

    /// Removes every lease (readers and writer) of the read-write lock
    /// `key` behind their holders' backs, as an operator's `DEL` would.
    /// Their renewals are refused and their guards report the loss.
    /// Returns how many were removed.
    pub fn force_expire_rw(&self, key: &str) -> usize {
        self.rw.force_expire(key)
    }

    /// Takes the key if it is free and `ticket` may take it (it is at the
    /// front of the queue, or there is no queue and no ticket).
    fn take_if_free(
        &self,
        entry: &mut KeyState,
        req: &AcquireRequest,
        ticket: Option<u64>,
        sent: Instant,
    ) -> Option<Lease> {
        let now = Instant::now();
        entry.expire(now);
        let my_turn = match ticket {
            Some(t) => entry.waiters.queue.front() == Some(&t),
            None => entry.waiters.queue.is_empty(),
        };
        if entry.holder.is_some() || !my_turn {
            return None;
        }
        if ticket.is_some() {
            entry.waiters.queue.pop_front();
        }
        let fence = self.fence.fetch_add(1, Ordering::Relaxed) + 1;
        entry.holder = Some(Holder {
            token: req.token.clone(),
            fence,
            expires: saturating_add(now, req.ttl),
        });
        Some(Lease {
            key: req.key.clone(),
            token: req.token.clone(),
            ttl: req.ttl,
            fencing_token: Some(fence),
            valid_until: lease_deadline(sent, req.ttl),
            resource: req.key.clone(),
        })
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn describe(&self) -> String {
        "memory://".to_owned()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let sent = Instant::now();
        Ok(table::try_once(&self.state, &req.key, |entry| {
            self.take_if_free(entry, req, None, sent)
        }))
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        table::wait_in_line(&self.state, &req.key, id, deadline, |entry, id, sent| {
            Ok(self.take_if_free(entry, req, Some(id), sent))
        })
        .await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        table::renew_each(&self.state, leases, |entry, token| {
            entry
                .holder
                .as_mut()
                .filter(|h| h.token == token)
                .map(|h| &mut h.expires)
        })
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        Ok(table::release(&self.state, &lease.key, |entry| {
            let ours = entry
                .holder
                .as_ref()
                .is_some_and(|h| h.token == lease.token);
            if ours {
                entry.holder = None;
            }
            ours
        }))
    }

    fn capabilities(&self) -> crate::backend::Capabilities<'_> {
        crate::backend::Capabilities {
            latch: Some(self),
            barrier: Some(self),
            ..crate::backend::Capabilities::all(self)
        }
    }

    fn client_name(&self) -> Option<&str> {
        Some(
            self.client_name
                .as_deref()
                .unwrap_or(crate::backend::holder::default_client_name()),
        )
    }

    async fn inspect(&self, key: &str) -> Result<Option<crate::LockInfo>, LockError> {
        let now = Instant::now();
        let state = lock_table(&self.state);
        Ok(state
            .get(key)
            .and_then(|e| e.holder.as_ref())
            .filter(|h| h.expires > now)
            .map(|h| {
                crate::LockInfo::new(
                    h.expires - now,
                    Some(h.fence),
                    crate::backend::holder::holder_of(&h.token).map(str::to_owned),
                )
            }))
    }

    /// The held keys of the table, read under its lock: one snapshot.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, crate::LockInfo)>, LockError> {
        let now = Instant::now();
        let state = lock_table(&self.state);
        let mut held = Vec::new();
        for (key, entry) in state.iter().filter(|(k, _)| k.starts_with(prefix)) {
            let Some(h) = entry.holder.as_ref().filter(|h| h.expires > now) else {
                continue;
            };
            if held.len() == crate::backend::holder::MAX_LISTED {
                return Err(crate::backend::holder::too_many_to_list(
                    &self.describe(),
                    prefix,
                ));
            }
            let info = crate::LockInfo::new(
                h.expires - now,
                Some(h.fence),
                crate::backend::holder::holder_of(&h.token).map(str::to_owned),
            );
            held.push((key.clone(), info));
        }
        held.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(held)
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let now = Instant::now();
        Ok(table::force_remove(&self.state, key, |entry| {
            entry.expire(now);
            entry.holder.take().is_some()
        }))
    }
}

// The semaphores live in `permits::PermitTable`, apart from the locks.
#[async_trait]
impl PermitBackend for MemoryBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        self.permits.try_acquire(req)
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.permits.acquire(req, deadline).await
    }

    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.permits.renew(leases)
    }

    fn many_permits(&self) -> bool {
        true
    }

    async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        self.permits.available(name, permits)
    }

    async fn inspect_semaphore(
        &self,
        name: &str,
    ) -> Result<crate::backend::SemaphoreInfo, LockError> {
        Ok(self.permits.inspect(name))
    }

    async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        Ok(self.permits.names(prefix))
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.permits.release(lease))
    }
}

// The read-write locks live in `rw::RwTable`, apart from the locks; they
// share the fence counter.
#[async_trait]
impl RwBackend for MemoryBackend {
    async fn try_acquire_rw(&self, req: &RwRequest) -> Result<Option<Lease>, LockError> {
        Ok(self.rw.try_acquire(req, &self.fence))
    }

    async fn acquire_rw(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.rw.acquire(req, deadline, &self.fence).await
    }

    async fn renew_rw(&self, mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.rw.renew(mode, leases)
    }

    async fn release_rw(&self, mode: RwMode, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.rw.release(mode, lease))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn req(key: &str, token: &str, ttl_ms: u64) -> AcquireRequest {
        AcquireRequest {
            key: key.into(),
            token: token.into(),
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    #[tokio::test]
    async fn lease_expires_on_the_server_side() {
        let b = MemoryBackend::new();
        let first = b.try_acquire(&req("k", "a", 50)).await.unwrap().unwrap();
        assert!(b.try_acquire(&req("k", "b", 50)).await.unwrap().is_none());
        tokio::time::sleep(Duration::from_millis(60)).await;
        let second = b.try_acquire(&req("k", "b", 50)).await.unwrap().unwrap();
        assert!(second.fencing_token > first.fencing_token);
        assert!(
            !b.release(&first).await.unwrap(),
            "a stale lease must not release"
        );
        assert!(b.release(&second).await.unwrap());
    }

    #[tokio::test]
    async fn waiters_are_served_in_arrival_order() {
        let b = Arc::new(MemoryBackend::new());
        let held = b.try_acquire(&req("k", "h", 5_000)).await.unwrap().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (b, order) = (b.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let r = req("k", &format!("w{i}"), 5_000);
                let lease = b.acquire(&r, None).await.unwrap().unwrap();
                order.lock().unwrap().push(i);
                b.release(&lease).await.unwrap();
            }));
            // Let each waiter enqueue before the next one starts.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        b.release(&held).await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_no_ticket() {
        let b = Arc::new(MemoryBackend::new());
        let held = b.try_acquire(&req("k", "h", 5_000)).await.unwrap().unwrap();
        let r = req("k", "w", 5_000);
        let waited = tokio::time::timeout(Duration::from_millis(20), b.acquire(&r, None)).await;
        assert!(waited.is_err());
        b.release(&held).await.unwrap();
        // Nothing queued: the key is free for a plain try.
        assert!(b.try_acquire(&req("k", "x", 100)).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn force_expire_makes_renewal_refused() {
        let b = MemoryBackend::new();
        let lease = b.try_acquire(&req("k", "a", 5_000)).await.unwrap().unwrap();
        assert!(b.force_expire("k"));
        let answers = b.renew(std::slice::from_ref(&lease)).await;
        assert!(matches!(answers[0], Ok(Renewal::Refused)));
    }
}
