//! The checker: from the workers' events, the store's log and the nemesis's record, the
//! figures of the report.
//!
//! Definitions (`dlock::guide::reliability` repeats them):
//!
//! - **Critical section completed**: a holding whose round ended (`release()` returned or
//!   the guard was dropped).
//! - **Overlap**: a store `begin` on a key while another worker's write interval on it was
//!   open (for a semaphore: while `N` were). A pair is *unsafe* when both writes were
//!   accepted, *rejected by fencing* when the store refused one for its fence, and *other*
//!   when one side gave up before writing (it saw `is_held()` false) or died.
//! - **Fence regression**: a holding of a key whose fence is not above the fence of a
//!   holding of that key whose `acquire()` had already returned when this one's `acquire()`
//!   was called (the service must have granted it later, so its fence must be higher).
//! - **`lost()` late**: a holding *H* was taken over (another worker's `acquire()` of the
//!   key returned, with a higher fence where fences exist) at time *T*, before *H*'s
//!   worker called `release()` or dropped the guard, and *H*'s worker did not learn it
//!   (by `lost()`, or `release()` answering `NotHeld`) by *T* + the tolerance. Another holder proves the server had expired *H*'s lease by *T*, and dlock
//!   promises `lost()` no later than the server could expire it. Excused, and counted
//!   apart: *H*'s worker was SIGSTOPped meanwhile (a stopped process observes nothing), or
//!   a fault made the server forget locks meanwhile (a loss the README documents: a Redis
//!   restarted without persistence; on PostgreSQL and MySQL, where locks live in sessions,
//!   a session the server ended at once by `restart-server`, `terminate-backend` or `reset`
//!   (MySQL: also kill -9 of the server); on the file backend, a lock file taken away by
//!   `replace-lock-file`; see [`Injected::forgets_locks`]).
//!   A `lost()` that was not late counts as *in time* (before the server could have
//!   expired the lease). Permits are not classified: N holders at once are allowed.

use std::collections::{BTreeMap, HashMap};

use crate::events::{Acquisition, EndHow, Event, HoldKind};
use crate::faults::FaultKind;
use crate::nemesis::Injected;
use crate::store::WriteRecord;
use crate::targets::WorkerEvent;

/// One holding of a lock, segment or permit, from a worker's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// Worker number.
    pub worker: usize,
    /// Which start of the worker.
    pub incarnation: u32,
    /// How it began: its number within that process, lock, segment or permit, the key,
    /// its fence, when `acquire()` was called and when it returned.
    pub acquired: Acquisition,
    /// When `lost()` resolved.
    pub lost: Option<u64>,
    /// How it ended, when `release()` was called (or the guard dropped) and when it
    /// returned; `None` if the worker died holding it.
    pub end: Option<(EndHow, u64, u64)>,
}

impl Holding {
    /// When the worker knew the lease was gone: `lost()`, or a `release()` that said
    /// `NotHeld`.
    pub fn noticed(&self) -> Option<u64> {
        let not_held = match self.end {
            Some((EndHow::NotHeld, _, t)) => Some(t),
            _ => None,
        };
        match (self.lost, not_held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The holdings, and the errors by `operation/kind`, in the workers' events.
pub fn holdings(events: &[WorkerEvent]) -> (Vec<Holding>, BTreeMap<String, usize>) {
    let mut open: HashMap<(usize, u32, u64), Holding> = HashMap::new();
    let mut errors = BTreeMap::new();
    for e in events {
        let id = |n| (e.worker, e.incarnation, n);
        match &e.event {
            Event::Acquired(acquired) => {
                let holding = Holding {
                    worker: e.worker,
                    incarnation: e.incarnation,
                    acquired: acquired.clone(),
                    lost: None,
                    end: None,
                };
                open.insert(id(acquired.n), holding);
            }
            Event::Lost { n, t } => {
                if let Some(h) = open.get_mut(&id(*n)) {
                    h.lost = Some(*t);
                }
            }
            Event::Ended { n, how, called, t } => {
                if let Some(h) = open.get_mut(&id(*n)) {
                    h.end = Some((*how, *called, *t));
                }
            }
            Event::Error { op, kind, .. } => {
                *errors.entry(format!("{op}/{kind}")).or_insert(0) += 1;
            }
            Event::Ready { .. } => {}
        }
    }
    let mut all: Vec<Holding> = open.into_values().collect();
    all.sort_by_key(|h| (h.acquired.returned, h.worker, h.incarnation, h.acquired.n));
    (all, errors)
}

/// The report's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// Holdings whose round ended.
    pub critical_sections: usize,
    /// Store writes accepted.
    pub writes_accepted: usize,
    /// Overlapping pairs on locks and segments where fencing refused one write.
    pub overlaps_fenced: usize,
    /// Overlapping pairs on locks and segments where both writes were accepted.
    pub overlaps_unsafe: usize,
    /// Overlapping pairs where one side gave up or died before writing.
    pub overlaps_other: usize,
    /// Semaphore begins that found all N permits' intervals open (no fencing there).
    pub permit_excess: usize,
    /// Fence regressions.
    pub fence_regressions: usize,
    /// Losses noticed before the server could have expired the lease.
    pub lost_in_time: usize,
    /// Losses noticed late (the exit rule).
    pub lost_late: usize,
    /// Late, but the worker was SIGSTOPped meanwhile.
    pub lost_while_paused: usize,
    /// Late, but a fault made the server forget locks meanwhile (a restart without
    /// persistence; a PostgreSQL or MySQL session ended by the server; a lock file taken
    /// away).
    pub lost_after_restart: usize,
    /// Permits reported lost (not classified).
    pub lost_permits: usize,
    /// Acquisitions (every kind).
    pub acquisitions: usize,
    /// Acquire latency, waiting included: p50, p99, max (ns).
    pub acquire_latency: Option<(u64, u64, u64)>,
    /// Longest time from a `release()` call that succeeded to the next holder's
    /// `acquire()` returning, when that holder was already waiting (ns, key).
    pub longest_free_wait: Option<(u64, String)>,
    /// Errors by `operation/kind`.
    pub errors: BTreeMap<String, usize>,
    /// Up to 10 descriptions of unsafe overlaps, late losses and fence regressions.
    pub examples: Vec<String>,
}

/// What the checker looks at.
pub struct History<'a> {
    /// The holdings.
    pub holdings: &'a [Holding],
    /// Errors by `operation/kind`.
    pub errors: BTreeMap<String, usize>,
    /// The store's records.
    pub records: &'a [WriteRecord],
    /// The faults injected.
    pub faults: &'a [Injected],
    /// Slack for `lost()` (ns).
    pub tolerance_ns: u64,
}

/// Computes the figures.
pub fn check(history: &History<'_>) -> Figures {
    let mut fig = Figures {
        errors: history.errors.clone(),
        ..Figures::default()
    };
    let holdings = history.holdings;
    fig.acquisitions = holdings.len();
    fig.critical_sections = holdings.iter().filter(|h| h.end.is_some()).count();
    overlaps(history.records, &mut fig);
    fence_regressions(holdings, &mut fig);
    losses(history, &mut fig);
    let mut latencies: Vec<u64> = holdings
        .iter()
        .map(|h| h.acquired.returned.saturating_sub(h.acquired.start))
        .collect();
    latencies.sort_unstable();
    if let Some(&max) = latencies.last() {
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        fig.acquire_latency = Some((at(0.5), at(0.99), max));
    }
    fig.longest_free_wait = longest_free_wait(holdings);
    fig
}

fn example(fig: &mut Figures, text: String) {
    if fig.examples.len() < 10 {
        fig.examples.push(text);
    }
}

fn overlaps(records: &[WriteRecord], fig: &mut Figures) {
    let by_id: HashMap<u64, &WriteRecord> = records.iter().map(|r| (r.id, r)).collect();
    for r in records {
        fig.writes_accepted += usize::from(r.outcome == crate::store::WriteOutcome::Accepted);
        if r.overlaps.is_empty() {
            continue;
        }
        if r.limit > 1 {
            fig.permit_excess += 1;
            continue;
        }
        for other in r.overlaps.iter().filter_map(|id| by_id.get(id)) {
            use crate::store::WriteOutcome::Accepted;
            if r.outcome == Accepted && other.outcome == Accepted {
                fig.overlaps_unsafe += 1;
                example(
                    fig,
                    format!(
                        "unsafe overlap on {}: {} (fence {:?}) and {} (fence {:?}) both written",
                        r.key, other.worker, other.fence, r.worker, r.fence
                    ),
                );
            } else if r.outcome.fenced_off() || other.outcome.fenced_off() {
                fig.overlaps_fenced += 1;
            } else {
                fig.overlaps_other += 1;
            }
        }
    }
}

fn fenced(holdings: &[Holding]) -> HashMap<&str, Vec<&Holding>> {
    let mut by_key: HashMap<&str, Vec<&Holding>> = HashMap::new();
    for h in holdings
        .iter()
        .filter(|h| h.acquired.kind != HoldKind::Permit)
    {
        by_key.entry(h.acquired.key.as_str()).or_default().push(h);
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|h| h.acquired.returned);
    }
    by_key
}

fn fence_regressions(holdings: &[Holding], fig: &mut Figures) {
    for (key, list) in fenced(holdings) {
        // running maximum of fences by return time
        let mut prefix_max = Vec::with_capacity(list.len());
        let mut max = None;
        for h in &list {
            max = max.max(h.acquired.fence);
            prefix_max.push(max);
        }
        for b in &list {
            let Some(fence) = b.acquired.fence else {
                continue;
            };
            let earlier = list.partition_point(|a| a.acquired.returned < b.acquired.start);
            if earlier == 0 {
                continue;
            }
            if let Some(before) = prefix_max[earlier - 1] {
                if fence <= before {
                    fig.fence_regressions += 1;
                    example(
                        fig,
                        format!(
                            "fence regression on {key}: worker {} got {fence} after {before} had been granted",
                            b.worker
                        ),
                    );
                }
            }
        }
    }
}

fn window_meets(fault: &Injected, from: u64, to: u64) -> bool {
    fault.start_ns <= to && fault.end_ns >= from
}

fn losses(history: &History<'_>, fig: &mut Figures) {
    fig.lost_permits = history
        .holdings
        .iter()
        .filter(|h| h.acquired.kind == HoldKind::Permit && h.lost.is_some())
        .count();
    for (key, list) in fenced(history.holdings) {
        for h in &list {
            // Died holding it: nothing to observe.
            let Some((_, let_go, _)) = h.end else {
                continue;
            };
            // From the release() call on, the worker claims nothing (and lost() never
            // fires after a release began); a NotHeld answer counts as noticing.
            let noticed = h.noticed();
            let until = noticed.map_or(let_go, |t| t.min(let_go));
            // the first other holder of the key that proves the lease was gone
            let takeover = list.iter().find(|g| {
                (g.worker, g.incarnation, g.acquired.n) != (h.worker, h.incarnation, h.acquired.n)
                    && g.acquired.returned > h.acquired.returned
                    && g.acquired.returned < until
                    && match (g.acquired.fence, h.acquired.fence) {
                        (Some(a), Some(b)) => a > b,
                        _ => true,
                    }
            });
            let Some(g) = takeover else {
                fig.lost_in_time += usize::from(noticed.is_some());
                continue;
            };
            if noticed.is_some_and(|t| t <= g.acquired.returned + history.tolerance_ns) {
                fig.lost_in_time += 1;
                continue;
            }
            let paused = history.faults.iter().any(|f| {
                matches!(
                    f.planned.kind,
                    FaultKind::PauseWorkerShort | FaultKind::PauseWorkerLong
                ) && f.worker == Some(h.worker)
                    && window_meets(f, h.acquired.start, until)
            });
            let restarted = history
                .faults
                .iter()
                .any(|f| f.forgets_locks && window_meets(f, h.acquired.start, until));
            if paused {
                fig.lost_while_paused += 1;
            } else if restarted {
                fig.lost_after_restart += 1;
            } else {
                fig.lost_late += 1;
                let how = noticed.map_or(format!("never noticed (ended {:?}) that", h.end), |t| {
                    format!(
                        "noticed {:.1} ms after",
                        (t - g.acquired.returned) as f64 / 1e6
                    )
                });
                example(
                    fig,
                    format!(
                        "late loss on {key}: worker {}.{} (fence {:?}) {how} worker {}.{} held it (fence {:?})",
                        h.worker, h.incarnation, h.acquired.fence, g.worker, g.incarnation, g.acquired.fence
                    ),
                );
            }
        }
    }
}

fn longest_free_wait(holdings: &[Holding]) -> Option<(u64, String)> {
    let mut best: Option<(u64, String)> = None;
    for (key, list) in fenced(holdings) {
        for a in &list {
            let Some((EndHow::Released, released, _)) = a.end else {
                continue;
            };
            let next = list
                .iter()
                .filter(|g| g.acquired.returned > released)
                .min_by_key(|g| g.acquired.returned);
            if let Some(g) = next.filter(|g| g.acquired.start < released) {
                let gap = g.acquired.returned - released;
                if best.as_ref().is_none_or(|(b, _)| gap > *b) {
                    best = Some((gap, key.to_string()));
                }
            }
        }
    }
    best
}
