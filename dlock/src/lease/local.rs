//! What one process keeps per backend: its local wait queue and its
//! watchdog, found by the backend's address.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use crate::backend::LockBackend;
use crate::lease::queue::LocalQueue;
use crate::lease::watchdog::Watchdog;

/// Per-backend local state.
#[derive(Debug)]
pub(crate) struct BackendLocal {
    backend: Weak<dyn LockBackend>,
    /// The per-key gates of this backend's waiters.
    pub(crate) queue: Arc<LocalQueue>,
    pub(crate) watchdog: Arc<Watchdog>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under this mutex is a single insert or retain, so a
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
        queue: Arc::default(),
        watchdog: Arc::new(Watchdog::new(backend.loss_alarm())),
    });
    map.insert(addr, local.clone());
    local
}

/// The local state of every backend that still exists.
pub(crate) fn all() -> Vec<Arc<BackendLocal>> {
    let mut map = lock(&LOCALS);
    map.retain(|_, l| l.backend.strong_count() > 0);
    map.values().cloned().collect()
}

impl BackendLocal {
    /// How many key slots this process keeps for the backend.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.queue.slot_count()
    }
}
