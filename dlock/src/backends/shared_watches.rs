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
//! it the server's watch); the dead name is swept out of the registry once
//! it has doubled since the last sweep. A watch whose server side ended (a stream
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
    by_name: Mutex<Registry>,
}

/// The names and their watches, some of them dead (their last waiter
/// gone): swept when the map has doubled since the last sweep, so a join
/// costs no walk over every latch of the backend.
#[derive(Debug, Default)]
struct Registry {
    watches: HashMap<String, Weak<SharedWatch>>,
    /// The size at which the next join sweeps the dead names out.
    sweep_at: usize,
}

/// The smallest map that is swept.
const SWEEP_FROM: usize = 64;

/// One name's watch: the generation its task bumps at each event.
#[derive(Debug)]
pub(crate) struct SharedWatch {
    changes: watch::Sender<u64>,
    /// Set once the server's watch is open; dropped with the last waiter,
    /// which stops the task that follows it.
    started: OnceCell<oneshot::Sender<()>>,
}

impl SharedWatches {
    fn names(&self) -> MutexGuard<'_, Registry> {
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
            if names.watches.len() >= names.sweep_at {
                names.watches.retain(|_, w| w.strong_count() > 0);
                names.sweep_at = (2 * names.watches.len()).max(SWEEP_FROM);
            }
            match names.watches.get(name).and_then(Weak::upgrade) {
                Some(shared) => shared,
                None => {
                    let shared = Arc::new(SharedWatch {
                        changes: watch::channel(0).0,
                        started: OnceCell::new(),
                    });
                    names
                        .watches
                        .insert(name.to_owned(), Arc::downgrade(&shared));
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
            .watches
            .get(name)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), ended))
        {
            names.watches.remove(name);
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn open(_: Weak<SharedWatch>) -> Result<oneshot::Sender<()>, LockError> {
        Ok(oneshot::channel().0)
    }

    #[tokio::test]
    async fn waiters_of_a_name_share_its_watch_and_the_last_one_ends_it() {
        let watches = SharedWatches::default();
        let first = watches.join("a", open).await.unwrap();
        let second = watches.join("a", open).await.unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        let seen = second.subscribe();
        first.bump();
        assert!(seen.has_changed().unwrap());
        drop((first, second, seen));
        let again = watches.join("a", open).await.unwrap();
        assert_eq!(
            Arc::strong_count(&again),
            1,
            "a new watch once the last waiter left"
        );
    }

    #[tokio::test]
    async fn names_whose_waiters_left_do_not_pile_up() {
        let watches = SharedWatches::default();
        for i in 0..10_000 {
            drop(watches.join(&format!("latch:{i}"), open).await.unwrap());
        }
        let live = watches.join("kept", open).await.unwrap();
        let size = watches.names().watches.len();
        assert!(
            size <= 2 * SWEEP_FROM,
            "{size} names kept for one live watch"
        );
        watches.forget("kept", &live);
        assert!(!watches.names().watches.contains_key("kept"));
    }
}
