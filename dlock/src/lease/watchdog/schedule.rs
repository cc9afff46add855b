//! The watchdog's leases in time order: what an event costs is the leases
//! it concerns, not every lease of the backend.
//!
//! Two min-heaps of `(instant, lease id)`: the leases' deadlines
//! (`valid_until`, for loss) and their renewals (`next_renew`). A renewal
//! or an extension pushes the lease's new entries; each lease records the
//! one entry of each heap that counts ([`Tracked::deadline_at`],
//! [`Tracked::renew_at`]), and any other entry is skipped and dropped when
//! it reaches the top, so the watchdog never wakes for a stale one. The
//! task wakes when the first renewal is due (or a deadline passes); the
//! batch then takes along, in order, the leases due within half their
//! renewal interval ([`COALESCE_DIVISOR`]), so leases taken at slightly
//! different times share a round trip. The heaps are rebuilt from the
//! live leases when stale entries outnumber them (released leases leave
//! theirs behind), so memory follows the leases held.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::deadline::saturating_add;
use crate::backend::suspend::SuspendClock;
use crate::lease::held::{LeaseShared, Status};

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
    /// Its entry in `renewals`; `None` while it is renewing (or never
    /// renewed).
    renew_at: Option<Instant>,
    /// Its renewal interval (a third of its ttl).
    interval: Duration,
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
}

/// Which heap an entry is in.
#[derive(Clone, Copy)]
enum Which {
    Deadline,
    Renewal,
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
    /// moved). Returns its first event.
    pub(super) fn insert(&mut self, shared: &Arc<LeaseShared>) -> Instant {
        let key = id(shared);
        let (deadline, renew_at, interval) = {
            let state = shared.lock_state();
            let renew = (shared.renew && !state.renewing).then_some(state.next_renew);
            (state.lease.valid_until, renew, state.lease.ttl / 3)
        };
        self.deadlines.push(Reverse((deadline, key)));
        if let Some(at) = renew_at {
            self.renewals.push(Reverse((at, key)));
        }
        self.leases.insert(
            key,
            Tracked {
                shared: shared.clone(),
                deadline_at: deadline,
                renew_at,
                interval,
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
            if !state.renewing {
                tracked.renew_at = Some(state.next_renew);
                self.renewals.push(Reverse((state.next_renew, *key)));
            }
        }
    }

    /// Takes off the leases a suspend of the host ended, to be marked lost:
    /// the heaps' instants are monotonic, which stood still meanwhile, so
    /// only a look at every lease finds them (once per suspend seen).
    pub(super) fn overdue_after_suspend(&mut self, clock: &SuspendClock) -> Vec<Arc<LeaseShared>> {
        let mut overdue = Vec::new();
        self.leases.retain(|_, tracked| {
            let lapsed = {
                let state = tracked.shared.lock_state();
                state.status == Status::Held
                    && clock.lease_now(&state.lease) >= state.lease.valid_until
            };
            if lapsed {
                overdue.push(tracked.shared.clone());
            }
            !lapsed
        });
        overdue
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
        tracked.renew_at = Some(state.next_renew);
        tracked.interval = state.lease.ttl / 3;
        self.renewals.push(Reverse((state.next_renew, key)));
        if state.lease.valid_until != tracked.deadline_at {
            tracked.deadline_at = state.lease.valid_until;
            self.deadlines.push(Reverse((state.lease.valid_until, key)));
        }
    }

    /// The first entry of `which` that counts, dropping stale ones on the
    /// way: its time, lease and renewal interval.
    fn top(&mut self, which: Which) -> Option<(Instant, usize, Duration)> {
        let heap = match which {
            Which::Deadline => &mut self.deadlines,
            Which::Renewal => &mut self.renewals,
        };
        while let Some(&Reverse((at, key))) = heap.peek() {
            let current = self.leases.get(&key).and_then(|t| match which {
                Which::Deadline => Some((t.deadline_at, t.interval)),
                Which::Renewal => t.renew_at.map(|r| (r, t.interval)),
            });
            match current {
                Some((counts, interval)) if counts == at => return Some((at, key, interval)),
                _ => {
                    heap.pop();
                }
            }
        }
        None
    }

    /// The leases that need something at `now`. Only a due lease starts a
    /// batch, which takes along the leases due within half their renewal
    /// interval: a batch whenever a lease merely came near would renew a
    /// trickle of leases a few at a time. With a batch in flight (`busy`),
    /// due leases wait for it and go in the next batch, unless they are a
    /// further renewal interval late (still a third of the ttl before
    /// their deadline): otherwise leases taken at slightly different times
    /// would each get a round trip of their own.
    pub(super) fn scan(&mut self, now: Instant, busy: bool) -> Scanned {
        let overdue = self.pop_deadlines(now);
        let mut due = Vec::new();
        let starts = |at: Instant, interval: Duration| {
            if busy {
                saturating_add(at, interval) <= now
            } else {
                at <= now
            }
        };
        if self
            .top(Which::Renewal)
            .is_some_and(|(at, _, interval)| starts(at, interval))
        {
            while let Some((at, key, interval)) = self.top(Which::Renewal) {
                let joins = if busy {
                    starts(at, interval)
                } else {
                    at <= saturating_add(now, interval / COALESCE_DIVISOR)
                };
                if !joins {
                    break;
                }
                self.renewals.pop();
                let Some(tracked) = self.leases.get_mut(&key) else {
                    continue;
                };
                tracked.renew_at = None;
                let mut state = tracked.shared.lock_state();
                if state.status == Status::Held && !state.renewing {
                    state.renewing = true;
                    drop(state);
                    due.push(tracked.shared.clone());
                }
            }
        }
        let mut next = self.top(Which::Deadline).map(|(at, _, _)| at);
        if let Some((at, _, interval)) = self.top(Which::Renewal) {
            let at = if busy {
                saturating_add(at, interval)
            } else {
                at
            };
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        Scanned { due, overdue, next }
    }

    /// Pops the deadlines that passed: leases lost (taken off), leases
    /// finished (forgotten), deadlines moved later (pushed again).
    fn pop_deadlines(&mut self, now: Instant) -> Vec<Arc<LeaseShared>> {
        let mut overdue = Vec::new();
        while let Some((at, key, _)) = self.top(Which::Deadline) {
            if at > now {
                break;
            }
            self.deadlines.pop();
            let Some(tracked) = self.leases.get_mut(&key) else {
                continue;
            };
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
