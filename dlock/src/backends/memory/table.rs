//! What the in-process backend's three tables (locks, semaphores,
//! read-write locks) do alike: each is a map of names to entries under one
//! mutex, an entry is made on first use and forgotten once idle, and each
//! kind says only how a lease is taken, found and removed on its entry.

use std::time::Instant;

use super::ticket::{changed_or_until, lock_table, Queued, Table, Ticket};
use crate::backend::deadline::saturating_add;
use crate::backend::{lease_deadline, Lease, Renewal};
use crate::LockError;

/// One try with no ticket: `take` on the entry of `name`, made if missing
/// and forgotten again if it stays idle.
pub(super) fn try_once<S: Queued, T>(
    table: &Table<S>,
    name: &str,
    take: impl FnOnce(&mut S) -> T,
) -> T {
    let mut state = lock_table(table);
    let entry = state.entry(name.to_owned()).or_insert_with(S::new);
    let taken = take(entry);
    if entry.is_idle() {
        state.remove(name);
    }
    taken
}

/// Waits in the FIFO line of `name` with the ticket `id` until `take` (the
/// entry, the ticket, when this try was sent) gives a lease, or until
/// `deadline` (`Ok(None)`). The ticket leaves the line however this ends.
pub(super) async fn wait_in_line<S: Queued>(
    table: &Table<S>,
    name: &str,
    id: u64,
    deadline: Option<Instant>,
    mut take: impl FnMut(&mut S, u64, Instant) -> Result<Option<Lease>, LockError>,
) -> Result<Option<Lease>, LockError> {
    let ticket = Ticket {
        state: table,
        name,
        id,
    };
    let mut queued = false;
    loop {
        let sent = Instant::now();
        // A try under the same lock that queues the ticket: the uncontended
        // acquisition takes the table's mutex once.
        let changed = {
            let mut state = lock_table(table);
            let entry = state.entry(name.to_owned()).or_insert_with(S::new);
            if !queued {
                entry.waiters().queue.push_back(ticket.id);
                queued = true;
            }
            let taken = take(entry, ticket.id, sent)?;
            if let Some(lease) = granted(entry, taken) {
                return Ok(Some(lease));
            }
            entry.waiters().changed.clone()
        };
        // Register for the notification, then try again, so a release
        // between the try above and this point is not missed.
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let earliest = {
            let mut state = lock_table(table);
            let entry = state.entry(name.to_owned()).or_insert_with(S::new);
            let taken = take(entry, ticket.id, sent)?;
            if let Some(lease) = granted(entry, taken) {
                return Ok(Some(lease));
            }
            entry.earliest_expiry()
        };
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Ok(None);
        }
        changed_or_until(notified.as_mut(), earliest, deadline).await;
    }
}

/// A lease `take` gave: our ticket is gone from the queue, so whoever is
/// now first in line may be admitted too (another free permit, the readers
/// behind a reader at once) or starts waiting on our lease's expiry.
fn granted<S: Queued>(entry: &mut S, taken: Option<Lease>) -> Option<Lease> {
    if taken.is_some() {
        entry.waiters().changed.notify_waiters();
    }
    taken
}

/// Renews each of `leases` whose live expiry `expiry_of` (the entry, the
/// lease's token) finds, from now for its ttl; the others are refused.
pub(super) fn renew_each<S>(
    table: &Table<S>,
    leases: &[Lease],
    expiry_of: impl for<'e> Fn(&'e mut S, &str) -> Option<&'e mut Instant>,
) -> Vec<Result<Renewal, LockError>> {
    let sent = Instant::now();
    let mut state = lock_table(table);
    leases
        .iter()
        .map(|lease| {
            let now = Instant::now();
            let expiry = state
                .get_mut(&lease.key)
                .and_then(|e| expiry_of(e, &lease.token))
                .filter(|expires| **expires > now);
            Ok(match expiry {
                Some(expires) => {
                    *expires = saturating_add(now, lease.ttl);
                    Renewal::Renewed {
                        valid_until: lease_deadline(sent, lease.ttl),
                    }
                }
                None => Renewal::Refused,
            })
        })
        .collect()
}

/// Releases a lease on the entry of `name`: after the entry's expired
/// leases are dropped, `remove` takes the lease out and says whether it was
/// there (still ours). Waiters are woken if it was.
pub(super) fn release<S: Queued>(
    table: &Table<S>,
    name: &str,
    remove: impl FnOnce(&mut S) -> bool,
) -> bool {
    let now = Instant::now();
    let mut state = lock_table(table);
    let Some(entry) = state.get_mut(name) else {
        return false;
    };
    entry.expire(now);
    let ours = remove(entry);
    if ours {
        entry.waiters().changed.notify_waiters();
    }
    if entry.is_idle() {
        state.remove(name);
    }
    ours
}

/// Removes leases of `name` behind their holders' backs, as an operator's
/// `DEL` would: `remove` takes them off the entry and says what it removed
/// (the default when there is no entry). Waiters are woken.
pub(super) fn force_remove<S: Queued, T: Default>(
    table: &Table<S>,
    name: &str,
    remove: impl FnOnce(&mut S) -> T,
) -> T {
    let mut state = lock_table(table);
    let Some(entry) = state.get_mut(name) else {
        return T::default();
    };
    let removed = remove(entry);
    entry.waiters().changed.notify_waiters();
    if entry.is_idle() {
        state.remove(name);
    }
    removed
}
