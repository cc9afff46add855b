//! A waiter's place in a FIFO queue of the in-process backend (a key's, a
//! semaphore's or a read-write lock's), taken out however its `acquire`
//! ends, and its nap between tries.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::Notify;

/// The state of one name that waiters queue on.
pub(super) trait Queued {
    /// Waiting tickets in arrival order.
    fn queue(&mut self) -> &mut VecDeque<u64>;
    /// Woken whenever the front of the queue may take the name.
    fn changed(&self) -> &Notify;
    /// Nothing held and nobody waiting: the entry can be forgotten.
    fn is_idle(&self) -> bool;
}

/// Removes a waiter's ticket when its `acquire` ends in any way, including
/// being dropped, so no ghost ticket blocks the queue.
pub(super) struct Ticket<'a, S: Queued> {
    pub(super) state: &'a Mutex<HashMap<String, S>>,
    pub(super) name: &'a str,
    pub(super) id: u64,
}

impl<S: Queued> Drop for Ticket<'_, S> {
    fn drop(&mut self) {
        // Every update under this mutex is a single insert, remove or
        // assignment: a poisoned one still guards consistent data.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = state.get_mut(self.name) {
            let queue = entry.queue();
            if let Some(pos) = queue.iter().position(|t| *t == self.id) {
                queue.remove(pos);
                // The next ticket may now be at the front of a free name.
                entry.changed().notify_waiters();
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
