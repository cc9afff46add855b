//! What one process keeps per backend: a wait gate per key (so only one local
//! waiter talks to the service), who holds each key for reentrancy, and the
//! backend's watchdog.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::backend::LockBackend;
use crate::guard::LeaseShared;
use crate::watchdog::Watchdog;

/// Per-backend local state, found by the backend's address.
#[derive(Debug)]
pub(crate) struct BackendLocal {
    backend: Weak<dyn LockBackend>,
    slots: Mutex<HashMap<String, Arc<KeySlot>>>,
    pub(crate) watchdog: Arc<Watchdog>,
}

/// One key's local state.
#[derive(Debug)]
pub(crate) struct KeySlot {
    /// One permit: held from the start of a backend acquire until the lease
    /// is released, so the other local waiters queue here (FIFO, tokio's
    /// semaphore is fair) instead of all asking the service.
    pub(crate) gate: Arc<Semaphore>,
    /// The gate's number of permits: 1 for a lock, N for a semaphore of N.
    capacity: usize,
    /// The slot's name in the map, for pruning it after a release.
    pub(crate) name: String,
    /// Who holds the key and its lease, for reentrancy.
    holder: Mutex<Option<(Owner, Weak<LeaseShared>)>>,
}

/// The context that reentrancy is scoped to: a tokio task, or, for the root
/// future of `block_on` (`#[tokio::main]`, `#[tokio::test]`), which is no
/// task, the thread it runs on: such a future never leaves its thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    BlockOn(std::thread::ThreadId),
}

impl Owner {
    pub(crate) fn current() -> Self {
        match tokio::task::try_id() {
            Some(id) => Owner::Task(id),
            None => Owner::BlockOn(std::thread::current().id()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these mutexes is a single insert/remove/assign, so a
    // poisoned mutex still guards consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type LocalMap = HashMap<usize, Arc<BackendLocal>>;
static LOCALS: LazyLock<Mutex<LocalMap>> = LazyLock::new(Default::default);

fn address(backend: &Arc<dyn LockBackend>) -> usize {
    Arc::as_ptr(backend) as *const () as usize
}

/// The local state of `backend`, created on first use.
pub(crate) fn for_backend(backend: &Arc<dyn LockBackend>) -> Arc<BackendLocal> {
    let mut map = lock(&LOCALS);
    let addr = address(backend);
    if let Some(local) = map.get(&addr) {
        // The same address may belong to a new backend after the old one was
        // dropped; the weak pointer tells them apart.
        if local
            .backend
            .upgrade()
            .is_some_and(|b| Arc::ptr_eq(&b, backend))
        {
            return local.clone();
        }
    }
    // Forget backends that no longer exist while we hold the map anyway.
    map.retain(|_, l| l.backend.strong_count() > 0);
    let local = Arc::new(BackendLocal {
        backend: Arc::downgrade(backend),
        slots: Mutex::new(HashMap::new()),
        watchdog: Arc::default(),
    });
    map.insert(addr, local.clone());
    local
}

impl BackendLocal {
    /// The slot of `key`, created on first use. Callers keep the `Arc` while
    /// they use it, which keeps it from being pruned.
    pub(crate) fn slot(&self, key: &str) -> Arc<KeySlot> {
        // Looked up by `&str` first: the common case allocates nothing.
        if let Some(slot) = lock(&self.slots).get(key) {
            return slot.clone();
        }
        self.slot_with(key.to_owned(), 1)
    }

    /// The slot of the semaphore `name`, whose gate lets `permits` local
    /// tasks talk to the service at once (the rest queue locally). Its map
    /// name starts with a control character, which no lock key may contain,
    /// so a semaphore and a lock of the same name never share a slot. The
    /// gate keeps the permit count of the slot's first user while it lives.
    pub(crate) fn semaphore_slot(&self, name: &str, permits: usize) -> Arc<KeySlot> {
        self.slot_with(format!("\u{1}semaphore:{name}"), permits)
    }

    /// The admission slot of the segmented lock `key` with `segments`
    /// segments: at most that many local tasks look for a segment at once.
    /// Named apart from locks and semaphores, as `semaphore_slot`.
    pub(crate) fn segments_slot(&self, key: &str, segments: usize) -> Arc<KeySlot> {
        self.slot_with(format!("\u{1}segments:{key}"), segments)
    }

    fn slot_with(&self, name: String, capacity: usize) -> Arc<KeySlot> {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(&name) {
            return slot.clone();
        }
        let slot = Arc::new(KeySlot {
            gate: Arc::new(Semaphore::new(capacity)),
            capacity,
            name: name.clone(),
            holder: Mutex::new(None),
        });
        slots.insert(name, slot.clone());
        slot
    }

    /// The slot of `key` if it exists; never creates one.
    pub(crate) fn existing_slot(&self, key: &str) -> Option<Arc<KeySlot>> {
        lock(&self.slots).get(key).cloned()
    }

    /// Drops the slot of `key` if nobody uses it any more, so a process that
    /// locks many distinct keys does not keep one slot per key forever.
    pub(crate) fn prune(&self, key: &str) {
        self.prune_unless_shared(key, 1);
    }

    /// Like [`prune`](Self::prune), for a caller that still holds one
    /// reference to `slot` (a lease being released): that reference does not
    /// count as a use.
    pub(crate) fn prune_released(&self, slot: &Arc<KeySlot>) {
        let is_same = lock(&self.slots)
            .get(&slot.name)
            .is_some_and(|s| Arc::ptr_eq(s, slot));
        if is_same {
            self.prune_unless_shared(&slot.name, 2);
        }
    }

    /// Removes `key`'s slot if only `owners` references exist (the map's and
    /// the caller's) and no permit of its gate is taken.
    fn prune_unless_shared(&self, key: &str, owners: usize) {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(key) {
            let unused =
                Arc::strong_count(slot) == owners && slot.gate.available_permits() == slot.capacity;
            if unused {
                slots.remove(key);
            }
        }
    }

    /// How many key slots this process keeps for the backend.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        lock(&self.slots).len()
    }
}

impl KeySlot {
    /// Waits for this process's turn on the slot: one attempt if `once`,
    /// else until `deadline` (`None`: no limit). `None`: no turn in time.
    ///
    /// Cancel safe: tokio's semaphore gives up a queued place when dropped.
    pub(crate) async fn wait_turn(
        &self,
        once: bool,
        deadline: Option<Instant>,
    ) -> Option<OwnedSemaphorePermit> {
        if once {
            return self.gate.clone().try_acquire_owned().ok();
        }
        let permit = crate::deadline::until(deadline, self.gate.clone().acquire_owned()).await?;
        // dlock never closes a gate, so `acquire_owned` cannot fail.
        permit.ok()
    }

    /// The live lease that `owner` already holds on this key, if any.
    pub(crate) fn held_by(&self, owner: Owner) -> Option<Arc<LeaseShared>> {
        let holder = lock(&self.holder);
        let (holder_owner, lease) = holder.as_ref()?;
        if *holder_owner != owner {
            return None;
        }
        lease.upgrade().filter(|l| l.is_held())
    }

    pub(crate) fn set_holder(&self, owner: Owner, lease: &Arc<LeaseShared>) {
        *lock(&self.holder) = Some((owner, Arc::downgrade(lease)));
    }

    /// Forgets the holder if it is `lease`.
    pub(crate) fn clear_holder(&self, lease: &LeaseShared) {
        let mut holder = lock(&self.holder);
        if holder
            .as_ref()
            .is_some_and(|(_, l)| std::ptr::eq(l.as_ptr(), lease))
        {
            *holder = None;
        }
    }
}
