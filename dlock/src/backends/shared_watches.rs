//! One server watch per name, shared by every waiter of one backend: the
//! count-down latches of etcd (a watch stream on the key) and ZooKeeper (a
//! watch on the node, set again after each event) wait this way, so 1,000
//! waiters of one latch cost one watch on the server.
//!
//! The first waiter of a name opens the watch (the backend's `open`, which
//! starts the task that follows it and answers the sender that stops it);
//! later waiters join it. The task bumps a generation at each event, and
//! waiters wait for the generation to move: a waiter subscribes before it
//! reads the state it waits on, so an event between its read and its wait
//! is not missed. The registry keeps names weakly: the last waiter gone
//! drops the watch, its stop sender with it, and the task ends (and with
//! it the server's watch). A watch whose server side ended (a stream
//! closed, a session gone) is `forget`ten, so the next waiter opens a new
//! one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::{oneshot, watch, OnceCell};

use crate::LockError;

/// The shared watches of one backend, by name.
#[derive(Debug, Default)]
pub(crate) struct SharedWatches {
    by_name: Mutex<HashMap<String, Weak<SharedWatch>>>,
}

/// One name's watch: the generation its task bumps at each event.
#[derive(Debug)]
pub(crate) struct SharedWatch {
    changes: watch::Sender<u64>,
    /// Set once the server's watch is open; dropped with the last waiter,
    /// which stops the task that follows it.
    started: OnceCell<oneshot::Sender<()>>,
}

impl SharedWatches {
    fn names(&self) -> MutexGuard<'_, HashMap<String, Weak<SharedWatch>>> {
        // Every update is one insert, remove or retain: a poisoned map is
        // still consistent.
        self.by_name.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open watch of `name`, joined, or opened by `open` (given the
    /// watch to bump, weakly; it answers the sender that stops its task).
    /// A failed `open` leaves the watch unopened for the next waiter to try.
    pub(crate) async fn join<F, Fut>(
        &self,
        name: &str,
        open: F,
    ) -> Result<Arc<SharedWatch>, LockError>
    where
        F: FnOnce(Weak<SharedWatch>) -> Fut,
        Fut: Future<Output = Result<oneshot::Sender<()>, LockError>>,
    {
        let shared = {
            let mut names = self.names();
            names.retain(|_, w| w.strong_count() > 0);
            match names.get(name).and_then(Weak::upgrade) {
                Some(shared) => shared,
                None => {
                    let shared = Arc::new(SharedWatch {
                        changes: watch::channel(0).0,
                        started: OnceCell::new(),
                    });
                    names.insert(name.to_owned(), Arc::downgrade(&shared));
                    shared
                }
            }
        };
        shared
            .started
            .get_or_try_init(|| open(Arc::downgrade(&shared)))
            .await?;
        Ok(shared)
    }

    /// `name`'s watch ended on the server: taken out of the registry (if
    /// `ended` is still the one there), so the next waiter opens another.
    pub(crate) fn forget(&self, name: &str, ended: &SharedWatch) {
        let mut names = self.names();
        if names
            .get(name)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), ended))
        {
            names.remove(name);
        }
    }
}

impl SharedWatch {
    /// Tells every waiter that something happened: they read again.
    pub(crate) fn bump(&self) {
        self.changes.send_modify(|generation| *generation += 1);
    }

    /// A waiter's view of the generation, taken before it reads: its
    /// `changed()` returns at the next bump.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        let mut changes = self.changes.subscribe();
        changes.borrow_and_update();
        changes
    }
}
