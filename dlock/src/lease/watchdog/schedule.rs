//! The watchdog's leases in time order: what an event costs is the leases
//! it concerns, not every lease of the backend.
//!
//! Two min-heaps of `(instant, lease id)`: the leases' deadlines
//! (`valid_until`, for loss), and the instants their renewals may join a
//! batch (`next_renew` less half their renewal interval, see
//! [`COALESCE_DIVISOR`]). Entries are not removed when a lease changes:
//! each lease records the one entry of each heap that counts
//! ([`Tracked::deadline_at`], [`Tracked::renew_at`]) and any other entry
//! popped for it is skipped. A renewal moves a deadline later without
//! touching the heap: the old entry, popped, is pushed again at the new
//! deadline, so a lease costs about one pop per deadline heap per ttl. A
//! lease whose renewal window opened waits in `ready` until one of them is
//! due, so leases taken at slightly different times share a batch. The
//! heaps are rebuilt from the live leases when stale entries outnumber
//! them (released leases leave theirs behind), so memory follows the
//! leases held.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use crate::backend::deadline::saturating_add;
use crate::lease::held::{LeaseShared, LeaseState, Status};

/// Leases due within this share of their renewal interval are renewed with
/// the batch, so leases taken at slightly different times share round trips.
pub(super) const COALESCE_DIVISOR: u32 = 2;

/// A lease's identity in the schedule: its address, stable while it is
/// watched (the schedule holds it).
pub(super) fn id(lease: &LeaseShared) -> usize {
    lease as *const LeaseShared as usize
}

type Heap = BinaryHeap<Reverse<(Instant, usize)>>;

/// One watched lease and its entries in the heaps.
#[derive(Debug)]
struct Tracked {
    shared: Arc<LeaseShared>,
    /// Its entry in `deadlines`.
    deadline_at: Instant,
    /// Its entry in `renewals`; `None` while it is ready or renewing (or
    /// never renewed).
    renew_at: Option<Instant>,
}

/// What one look at the schedule found.
pub(super) struct Scanned {
    /// Leases to renew now (marked renewing).
    pub(super) due: Vec<Arc<LeaseShared>>,
    /// Leases whose deadline passed (taken off the schedule): the caller
    /// marks them lost.
    pub(super) overdue: Vec<Arc<LeaseShared>>,
    /// When to look again (`None`: nothing to watch).
    pub(super) next: Option<Instant>,
}

/// The leases of one watchdog, by deadline and by renewal.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    leases: HashMap<usize, Tracked>,
    deadlines: Heap,
    renewals: Heap,
    /// Leases in their renewal window, waiting for one of them to be due.
    ready: Vec<usize>,
}

/// Makes `next` the earlier of itself and `at`.
fn earliest(next: &mut Option<Instant>, at: Instant) {
    *next = Some(next.map_or(at, |n| n.min(at)));
}

/// When a lease with this state may join a renewal batch.
fn window_opens(state: &LeaseState) -> Instant {
    let half = state.lease.ttl / 3 / COALESCE_DIVISOR;
    state
        .next_renew
        .checked_sub(half)
        .unwrap_or(state.next_renew)
}

impl Schedule {
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.leases.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Watches `shared` (again, if it is watched: its times may have
    /// moved earlier). Returns its first event.
    pub(super) fn insert(&mut self, shared: &Arc<LeaseShared>) -> Instant {
        let key = id(shared);
        let (deadline, renew_at) = {
            let state = shared.lock_state();
            let renew = (shared.renew && !state.renewing).then(|| window_opens(&state));
            (state.lease.valid_until, renew)
        };
        self.deadlines.push(Reverse((deadline, key)));
        if let Some(at) = renew_at {
            self.renewals.push(Reverse((at, key)));
        }
        // A lease already ready stays ready; its new entry, if any, is
        // skipped when popped while it is not `renew_at`.
        let was_ready = self.ready.contains(&key);
        self.leases.insert(
            key,
            Tracked {
                shared: shared.clone(),
                deadline_at: deadline,
                renew_at: renew_at.filter(|_| !was_ready),
            },
        );
        self.compact_if_stale();
        renew_at.map_or(deadline, |at| at.min(deadline))
    }

    /// Stops watching the lease `key`.
    pub(super) fn remove(&mut self, key: usize) {
        self.leases.remove(&key);
        self.compact_if_stale();
    }

    /// Stops watching every lease and returns them.
    pub(super) fn drain(&mut self) -> Vec<Arc<LeaseShared>> {
        self.deadlines.clear();
        self.renewals.clear();
        self.ready.clear();
        self.leases.drain().map(|(_, t)| t.shared).collect()
    }

    /// Makes every renewed lease due now (the backend raised its alarm).
    pub(super) fn all_due(&mut self, now: Instant) {
        for (key, tracked) in &mut self.leases {
            let shared = &tracked.shared;
            if !shared.renew {
                continue;
            }
            let mut state = shared.lock_state();
            state.next_renew = state.next_renew.min(now);
            if !state.renewing && tracked.renew_at.is_some() {
                tracked.renew_at = Some(now);
                self.renewals.push(Reverse((now, *key)));
            }
        }
    }

    /// Puts a lease whose renewal came back on the schedule again.
    pub(super) fn renewed(&mut self, shared: &LeaseShared) {
        let key = id(shared);
        let Some(tracked) = self.leases.get_mut(&key) else {
            return;
        };
        let state = shared.lock_state();
        if state.status != Status::Held || state.renewing {
            return;
        }
        let at = window_opens(&state);
        tracked.renew_at = Some(at);
        self.renewals.push(Reverse((at, key)));
        // A deadline moved earlier must be seen (a later one is caught
        // when the old entry pops).
        if state.lease.valid_until < tracked.deadline_at {
            tracked.deadline_at = state.lease.valid_until;
            self.deadlines.push(Reverse((state.lease.valid_until, key)));
        }
    }

    /// The leases that need something at `now`. With a batch in flight
    /// (`busy`), ready leases wait for it and go in the next batch, unless
    /// they are a further renewal interval late (still a third of the ttl
    /// before their deadline): otherwise leases taken at slightly
    /// different times would each get a round trip of their own. Only a
    /// due lease starts a batch, which takes the ready ones along: a batch
    /// whenever a lease merely entered its window would renew a trickle of
    /// leases a few at a time.
    pub(super) fn scan(&mut self, now: Instant, busy: bool) -> Scanned {
        let overdue = self.pop_deadlines(now);
        self.pop_renewals(now);
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        // What the ready leases ask for.
        let mut any_due = false;
        let mut still_ready = Vec::with_capacity(self.ready.len());
        for key in self.ready.drain(..) {
            let Some(tracked) = self.leases.get(&key) else {
                continue;
            };
            let state = tracked.shared.lock_state();
            if state.status != Status::Held || state.renewing {
                continue;
            }
            let interval = state.lease.ttl / 3;
            let urgent_at = saturating_add(state.next_renew, interval);
            if busy && now >= urgent_at {
                due.push(key);
            } else {
                any_due |= now >= state.next_renew;
                earliest(&mut next, if busy { urgent_at } else { state.next_renew });
                still_ready.push(key);
            }
        }
        if !busy && any_due {
            due.append(&mut still_ready);
            next = None;
        }
        self.ready = still_ready;
        let due: Vec<Arc<LeaseShared>> = due
            .into_iter()
            .filter_map(|key| self.leases.get(&key).map(|t| t.shared.clone()))
            .collect();
        for shared in &due {
            shared.lock_state().renewing = true;
        }
        for heap in [&self.deadlines, &self.renewals] {
            if let Some(Reverse((at, _))) = heap.peek() {
                earliest(&mut next, *at);
            }
        }
        Scanned { due, overdue, next }
    }

    /// Pops the deadlines that passed: leases lost (taken off), leases
    /// finished (forgotten), deadlines moved later by renewals (pushed
    /// again).
    fn pop_deadlines(&mut self, now: Instant) -> Vec<Arc<LeaseShared>> {
        let mut overdue = Vec::new();
        while let Some(&Reverse((at, key))) = self.deadlines.peek() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            let Some(tracked) = self.leases.get_mut(&key) else {
                continue;
            };
            if tracked.deadline_at != at {
                continue;
            }
            let (status, valid_until) = {
                let state = tracked.shared.lock_state();
                (state.status, state.lease.valid_until)
            };
            if status != Status::Held {
                self.leases.remove(&key);
            } else if now >= valid_until {
                if let Some(tracked) = self.leases.remove(&key) {
                    overdue.push(tracked.shared);
                }
            } else {
                tracked.deadline_at = valid_until;
                self.deadlines.push(Reverse((valid_until, key)));
            }
        }
        overdue
    }

    /// Pops the renewal windows that opened: the leases join `ready`.
    fn pop_renewals(&mut self, now: Instant) {
        while let Some(&Reverse((at, key))) = self.renewals.peek() {
            if at > now {
                break;
            }
            self.renewals.pop();
            let Some(tracked) = self.leases.get_mut(&key) else {
                continue;
            };
            if tracked.renew_at != Some(at) {
                continue;
            }
            let state = tracked.shared.lock_state();
            if state.status != Status::Held || state.renewing {
                tracked.renew_at = None;
                continue;
            }
            let opens = window_opens(&state);
            drop(state);
            if opens > now {
                // Moved later (an extension): wait for the new window.
                tracked.renew_at = Some(opens);
                self.renewals.push(Reverse((opens, key)));
            } else {
                tracked.renew_at = None;
                self.ready.push(key);
            }
        }
    }

    /// Rebuilds the heaps from the watched leases when stale entries
    /// outnumber live ones.
    fn compact_if_stale(&mut self) {
        let live = self.leases.len();
        let stale = |heap: &Heap| heap.len() > 2 * live + 64;
        if !stale(&self.deadlines) && !stale(&self.renewals) {
            return;
        }
        self.deadlines = self
            .leases
            .iter()
            .map(|(key, t)| Reverse((t.deadline_at, *key)))
            .collect();
        self.renewals = self
            .leases
            .iter()
            .filter_map(|(key, t)| t.renew_at.map(|at| Reverse((at, *key))))
            .collect();
    }
}
