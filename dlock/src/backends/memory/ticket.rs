//! A waiter's place in a FIFO queue of the in-process backend (a key's, a
//! semaphore's or a read-write lock's), taken out however its `acquire`
//! ends, and its nap between tries; beneath them, the table type every
//! kind keeps its entries in (`table.rs` builds on this file).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

/// One table of names to entries.
pub(super) type Table<S> = Mutex<HashMap<String, S>>;

pub(super) fn lock_table<S>(table: &Table<S>) -> MutexGuard<'_, HashMap<String, S>> {
    // Every update under these mutexes is a single insert, remove or
    // assignment: a poisoned one still guards consistent data.
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// The waiters of one name: their tickets and their wake-up.
#[derive(Debug)]
pub(super) struct Waiters {
    /// Waiting tickets in arrival order; only the front may take the name.
    pub(super) queue: VecDeque<u64>,
    /// Woken whenever the front of the queue may take the name.
    pub(super) changed: Arc<Notify>,
}

impl Waiters {
    pub(super) fn new() -> Self {
        Waiters {
            queue: VecDeque::new(),
            changed: Arc::new(Notify::new()),
        }
    }
}

/// The state of one name that waiters queue on.
pub(super) trait Queued {
    /// The state of a name nobody holds or waits for.
    fn new() -> Self;
    fn waiters(&mut self) -> &mut Waiters;
    /// Drops expired leases, as a server's expiry would.
    fn expire(&mut self, now: Instant);
    /// The earliest expiry of a lease that may be in a waiter's way.
    fn earliest_expiry(&self) -> Option<Instant>;
    /// Nothing held and nobody waiting: the entry can be forgotten.
    fn is_idle(&self) -> bool;
}

/// Removes a waiter's ticket when its `acquire` ends in any way, including
/// being dropped, so no ghost ticket blocks the queue.
pub(super) struct Ticket<'a, S: Queued> {
    pub(super) state: &'a Table<S>,
    pub(super) name: &'a str,
    pub(super) id: u64,
}

impl<S: Queued> Drop for Ticket<'_, S> {
    fn drop(&mut self) {
        let mut state = lock_table(self.state);
        if let Some(entry) = state.get_mut(self.name) {
            let waiters = entry.waiters();
            if let Some(pos) = waiters.queue.iter().position(|t| *t == self.id) {
                waiters.queue.remove(pos);
                // The next ticket may now be at the front of a free name.
                waiters.changed.notify_waiters();
            }
            if entry.is_idle() {
                state.remove(self.name);
            }
        }
    }
}

/// A waiter's nap: until `notified` (the entry changed), or until the
/// earlier of `expiry` (a lease in the way ends, which notifies no one) and
/// `deadline`.
pub(super) async fn changed_or_until(
    notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    expiry: Option<Instant>,
    deadline: Option<Instant>,
) {
    let wake_at = match (expiry, deadline) {
        (Some(e), Some(d)) => Some(e.min(d)),
        (e, d) => e.or(d),
    };
    match wake_at {
        Some(at) => {
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(at.into()) => {}
            }
        }
        None => notified.await,
    }
}
