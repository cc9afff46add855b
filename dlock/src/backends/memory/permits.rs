//! The semaphores of the in-process backend: per name, a table of permit
//! holders with server-side deadlines, the permit count its first holder
//! gave, and FIFO tickets for waiters.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use super::ticket::{changed_or_until, Queued, Ticket};
use crate::backend::deadline::saturating_add;
use crate::backend::{lease_deadline, permit_count_differs, Lease, PermitRequest, Renewal};
use crate::LockError;

/// Every semaphore of one `MemoryBackend`.
#[derive(Debug, Default)]
pub(super) struct PermitTable {
    state: Mutex<HashMap<String, SemaphoreState>>,
    next_ticket: AtomicU64,
}

#[derive(Debug)]
struct SemaphoreState {
    /// Permit token → server-side expiry.
    holders: HashMap<String, Instant>,
    /// Waiting tickets in arrival order; only the front may take a free permit.
    queue: VecDeque<u64>,
    /// The permit count the holders took their permits with: set by the
    /// first holder, binding while any permit is live (see
    /// [`permit_count_differs`]).
    permits: usize,
    changed: Arc<Notify>,
}

impl SemaphoreState {
    fn new() -> Self {
        SemaphoreState {
            holders: HashMap::new(),
            queue: VecDeque::new(),
            permits: 0,
            changed: Arc::new(Notify::new()),
        }
    }

    /// Drops expired permits, as a server's expiry would, and wakes waiters
    /// if that freed any.
    fn expire(&mut self, now: Instant) {
        let before = self.holders.len();
        self.holders.retain(|_, expires| *expires > now);
        if self.holders.len() < before {
            self.changed.notify_waiters();
        }
    }

    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }

    fn earliest_expiry(&self) -> Option<Instant> {
        self.holders.values().min().copied()
    }
}

/// The local name of the permit, shown as the lease's resource.
fn resource(req: &PermitRequest) -> String {
    format!("semaphore:{}", req.name)
}

impl PermitTable {
    fn lock_state(&self) -> MutexGuard<'_, HashMap<String, SemaphoreState>> {
        // Every update is a single insert/remove/assign: poisoning cannot
        // leave the table half-updated.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a permit if one is free and `ticket` may take it (front of the
    /// queue, or no queue and no ticket). A count other than the live
    /// holders' is refused.
    fn take_if_free(
        entry: &mut SemaphoreState,
        req: &PermitRequest,
        ticket: Option<u64>,
        sent: Instant,
    ) -> Result<Option<Lease>, LockError> {
        let now = Instant::now();
        entry.expire(now);
        if !entry.holders.is_empty() && entry.permits != req.permits {
            return Err(permit_count_differs(&req.name, entry.permits, req.permits));
        }
        let my_turn = match ticket {
            Some(t) => entry.queue.front() == Some(&t),
            None => entry.queue.is_empty(),
        };
        if entry.holders.len() >= req.permits || !my_turn {
            return Ok(None);
        }
        if ticket.is_some() {
            entry.queue.pop_front();
        }
        entry.permits = req.permits;
        entry
            .holders
            .insert(req.token.clone(), saturating_add(now, req.ttl));
        Ok(Some(Lease {
            key: req.name.clone(),
            token: req.token.clone(),
            ttl: req.ttl,
            fencing_token: None,
            valid_until: lease_deadline(sent, req.ttl),
            resource: resource(req),
        }))
    }

    pub(super) fn try_acquire(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let sent = Instant::now();
        let mut state = self.lock_state();
        let entry = state
            .entry(req.name.clone())
            .or_insert_with(SemaphoreState::new);
        let lease = Self::take_if_free(entry, req, None, sent);
        if entry.is_idle() {
            state.remove(&req.name);
        }
        lease
    }

    pub(super) async fn acquire(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let ticket = Ticket {
            state: &self.state,
            name: &req.name,
            id: self.next_ticket.fetch_add(1, Ordering::Relaxed),
        };
        let mut queued = false;
        loop {
            let sent = Instant::now();
            // Register for the notification before checking, so a release
            // between the check and the wait is not missed.
            let changed = {
                let mut state = self.lock_state();
                let entry = state
                    .entry(req.name.clone())
                    .or_insert_with(SemaphoreState::new);
                if !queued {
                    entry.queue.push_back(ticket.id);
                    queued = true;
                }
                entry.changed.clone()
            };
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let earliest = {
                let mut state = self.lock_state();
                let entry = state
                    .entry(req.name.clone())
                    .or_insert_with(SemaphoreState::new);
                if let Some(lease) = Self::take_if_free(entry, req, Some(ticket.id), sent)? {
                    // The next ticket is now at the front; there may be
                    // another free permit for it.
                    entry.changed.notify_waiters();
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

    pub(super) fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let sent = Instant::now();
        let mut state = self.lock_state();
        leases
            .iter()
            .map(|lease| {
                let now = Instant::now();
                let expiry = state
                    .get_mut(&lease.key)
                    .and_then(|e| e.holders.get_mut(&lease.token))
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

    pub(super) fn release(&self, lease: &Lease) -> bool {
        let now = Instant::now();
        let mut state = self.lock_state();
        let Some(entry) = state.get_mut(&lease.key) else {
            return false;
        };
        entry.expire(now);
        let ours = entry.holders.remove(&lease.token).is_some();
        if ours {
            entry.changed.notify_waiters();
        }
        if entry.is_idle() {
            state.remove(&lease.key);
        }
        ours
    }

    /// Removes every permit of `name` behind its holders' backs. Returns how many.
    pub(super) fn force_expire(&self, name: &str) -> usize {
        let mut state = self.lock_state();
        let Some(entry) = state.get_mut(name) else {
            return 0;
        };
        let removed = entry.holders.len();
        entry.holders.clear();
        entry.changed.notify_waiters();
        if entry.is_idle() {
            state.remove(name);
        }
        removed
    }

    /// How many live permits `name` has.
    pub(super) fn held(&self, name: &str) -> usize {
        let now = Instant::now();
        self.lock_state()
            .get(name)
            .map_or(0, |e| e.holders.values().filter(|x| **x > now).count())
    }
}

impl Queued for SemaphoreState {
    fn queue(&mut self) -> &mut VecDeque<u64> {
        &mut self.queue
    }
    fn changed(&self) -> &Notify {
        &self.changed
    }
    fn is_idle(&self) -> bool {
        SemaphoreState::is_idle(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn req(name: &str, token: &str, permits: usize, ttl_ms: u64) -> PermitRequest {
        PermitRequest {
            name: name.into(),
            permits,
            token: token.into(),
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    #[test]
    fn counts_permits_and_expires_them() {
        let t = PermitTable::default();
        let a = t.try_acquire(&req("s", "a", 2, 40)).unwrap().unwrap();
        assert!(t.try_acquire(&req("s", "b", 2, 5_000)).unwrap().is_some());
        assert!(t.try_acquire(&req("s", "c", 2, 5_000)).unwrap().is_none());
        assert_eq!(t.held("s"), 2);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.release(&a), "an expired permit is not ours any more");
        assert!(t.try_acquire(&req("s", "c", 2, 5_000)).unwrap().is_some());
        assert_eq!(t.force_expire("s"), 2);
        assert_eq!(t.held("s"), 0);
    }

    #[test]
    fn the_first_holders_count_binds_until_the_last_permit_goes() {
        let t = PermitTable::default();
        let a = t.try_acquire(&req("s", "a", 3, 5_000)).unwrap().unwrap();
        let err = t
            .try_acquire(&req("s", "b", 1, 5_000))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("semaphore `s` has 3 permits on the server, this caller asked for 1"),
            "{err}"
        );
        assert!(t.try_acquire(&req("s", "c", 3, 5_000)).unwrap().is_some());
        assert!(t.release(&a));
        assert!(t.try_acquire(&req("s", "d", 1, 5_000)).is_err(), "c holds");
        assert_eq!(t.force_expire("s"), 1);
        assert!(t.try_acquire(&req("s", "e", 1, 5_000)).unwrap().is_some());
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_no_ticket() {
        let t = PermitTable::default();
        let held = t.try_acquire(&req("s", "h", 1, 5_000)).unwrap().unwrap();
        let waited = tokio::time::timeout(
            Duration::from_millis(20),
            t.acquire(&req("s", "w", 1, 100), None),
        )
        .await;
        assert!(waited.is_err());
        assert!(t.release(&held));
        assert!(t.try_acquire(&req("s", "x", 1, 100)).unwrap().is_some());
    }

    #[tokio::test]
    async fn a_waiter_wakes_at_the_earliest_expiry() {
        let t = PermitTable::default();
        let _held = t.try_acquire(&req("s", "h", 1, 60)).unwrap().unwrap();
        let start = Instant::now();
        let got = t.acquire(&req("s", "w", 1, 5_000), None).await.unwrap();
        assert!(got.is_some());
        assert!(start.elapsed() < Duration::from_millis(500));
    }
}
