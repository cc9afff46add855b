//! The semaphores of the in-process backend: per name, a table of permit
//! holders with server-side deadlines and weights (how many permits each
//! holds), the permit count its first holder gave, and FIFO tickets for
//! waiters: only the front waiter may take, so a waiting taker of 4 is not
//! overtaken by a later taker of 1.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::table;
use super::ticket::{lock_table, Table};
use super::ticket::{Queued, Waiters};
use crate::backend::deadline::saturating_add;
use crate::backend::holder::holder_of;
use crate::backend::{
    lease_deadline, permit_count_differs, Lease, PermitHolder, PermitRequest, Renewal,
    SemaphoreInfo,
};
use crate::LockError;

/// Every semaphore of one `MemoryBackend`.
#[derive(Debug, Default)]
pub(super) struct PermitTable {
    state: Table<SemaphoreState>,
    next_ticket: AtomicU64,
}

#[derive(Debug)]
struct SemaphoreState {
    /// Permit token → server-side expiry and how many permits it holds.
    holders: HashMap<String, Holder>,
    /// The permit count the holders took their permits with: set by the
    /// first holder, binding while any permit is live (see
    /// [`permit_count_differs`]).
    permits: usize,
    /// Waiters in arrival order; only the front may take a free permit.
    waiters: Waiters,
}

/// One live permit lease.
#[derive(Debug)]
struct Holder {
    expires: Instant,
    count: usize,
}

impl SemaphoreState {
    /// How many permits the holders hold together.
    fn held_weight(&self) -> usize {
        self.holders.values().map(|h| h.count).sum()
    }
}

impl Queued for SemaphoreState {
    fn new() -> Self {
        SemaphoreState {
            holders: HashMap::new(),
            permits: 0,
            waiters: Waiters::new(),
        }
    }

    fn waiters(&mut self) -> &mut Waiters {
        &mut self.waiters
    }

    /// Also wakes waiters if that freed any permit.
    fn expire(&mut self, now: Instant) {
        let before = self.holders.len();
        self.holders.retain(|_, holder| holder.expires > now);
        if self.holders.len() < before {
            self.waiters.changed.notify_waiters();
        }
    }

    fn earliest_expiry(&self) -> Option<Instant> {
        self.holders.values().map(|h| h.expires).min()
    }

    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.waiters.queue.is_empty()
    }
}

/// The local name of the permit, shown as the lease's resource.
fn resource(req: &PermitRequest) -> String {
    format!("semaphore:{}", req.name)
}

impl PermitTable {
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
            Some(t) => entry.waiters.queue.front() == Some(&t),
            None => entry.waiters.queue.is_empty(),
        };
        // Whole or nothing: a taker of `count` waits (at the front, so
        // nobody behind it passes) until `count` are free.
        if entry.held_weight().saturating_add(req.count) > req.permits || !my_turn {
            return Ok(None);
        }
        if ticket.is_some() {
            entry.waiters.queue.pop_front();
        }
        entry.permits = req.permits;
        entry.holders.insert(
            req.token.clone(),
            Holder {
                expires: saturating_add(now, req.ttl),
                count: req.count,
            },
        );
        let valid_until = lease_deadline(sent, req.ttl);
        let lease = Lease::unfenced(&req.name, &req.token, req.ttl, valid_until, resource(req));
        Ok(Some(lease))
    }

    pub(super) fn try_acquire(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let sent = Instant::now();
        table::try_once(&self.state, &req.name, |entry| {
            Self::take_if_free(entry, req, None, sent)
        })
    }

    pub(super) async fn acquire(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        table::wait_in_line(&self.state, &req.name, id, deadline, |entry, id, sent| {
            Self::take_if_free(entry, req, Some(id), sent)
        })
        .await
    }

    pub(super) fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        table::renew_each(&self.state, leases, |entry, token| {
            entry.holders.get_mut(token).map(|h| &mut h.expires)
        })
    }

    pub(super) fn release(&self, lease: &Lease) -> bool {
        table::release(&self.state, &lease.key, |entry| {
            entry.holders.remove(&lease.token).is_some()
        })
    }

    /// Removes every permit of `name` behind its holders' backs. Returns how many.
    pub(super) fn force_expire(&self, name: &str) -> usize {
        table::force_remove(&self.state, name, |entry| {
            let removed = entry.holders.len();
            entry.holders.clear();
            removed
        })
    }

    /// How many live permits `name` has out (a holder of n counts n).
    pub(super) fn held(&self, name: &str) -> usize {
        let now = Instant::now();
        lock_table(&self.state).get(name).map_or(0, |e| {
            e.holders
                .values()
                .filter(|h| h.expires > now)
                .map(|h| h.count)
                .sum()
        })
    }

    /// How many of `permits` are free: refused if the live holders took
    /// theirs with another count.
    pub(super) fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        let now = Instant::now();
        let table = lock_table(&self.state);
        let Some(entry) = table.get(name) else {
            return Ok(permits);
        };
        let live = entry.holders.values().filter(|h| h.expires > now);
        let (holders, held) = live.fold((0, 0usize), |(n, w), h| (n + 1, w + h.count));
        if holders > 0 && entry.permits != permits {
            return Err(permit_count_differs(name, entry.permits, permits));
        }
        Ok(permits.saturating_sub(held))
    }

    /// `inspect_semaphore`: the live holders (their client names from the
    /// tokens) and the count they took with.
    pub(super) fn inspect(&self, name: &str) -> SemaphoreInfo {
        let now = Instant::now();
        let table = lock_table(&self.state);
        let Some(entry) = table.get(name) else {
            return SemaphoreInfo::new(None, Vec::new());
        };
        let holders: Vec<_> = entry
            .holders
            .iter()
            .filter(|(_, h)| h.expires > now)
            .map(|(token, h)| PermitHolder::new(holder_of(token).map(str::to_owned), None, h.count))
            .collect();
        let permits = (!holders.is_empty()).then_some(entry.permits);
        SemaphoreInfo::new(permits, holders)
    }

    /// `semaphore_names`: the names with a live holder.
    pub(super) fn names(&self, prefix: &str) -> Vec<String> {
        let now = Instant::now();
        let table = lock_table(&self.state);
        table
            .iter()
            .filter(|(name, e)| {
                name.starts_with(prefix) && e.holders.values().any(|h| h.expires > now)
            })
            .map(|(name, _)| name.clone())
            .collect()
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
            count: 1,
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
