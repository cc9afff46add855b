//! What one process keeps per backend: a wait gate per key (so only one local
//! waiter talks to the service), who holds each key for reentrancy, and the
//! backend's watchdog.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use tokio::sync::Semaphore;

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
        lock(&self.slots)
            .entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(KeySlot {
                    gate: Arc::new(Semaphore::new(1)),
                    holder: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Drops the slot of `key` if nobody uses it any more, so a process that
    /// locks many distinct keys does not keep one slot per key forever.
    pub(crate) fn prune(&self, key: &str) {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(key) {
            let unused = Arc::strong_count(slot) == 1 && slot.gate.available_permits() == 1;
            if unused {
                slots.remove(key);
            }
        }
    }
}

impl KeySlot {
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
