//! The nemesis's plan: which fault, on what, when and for how long, drawn from a seed.
//!
//! The plan depends only on the seed and the [`ScheduleParams`] (run length, ttl, worker
//! and member counts, fault kinds that apply), so the same command line prints the same
//! plan again: a run that found something can be replayed. Every kind is placed once
//! first, in a shuffled order, so even a short run injects each; then kinds are drawn at
//! random until the run's end. Faults never overlap: each ends, and a gap of ttl/4 to
//! ttl/2 lets the system settle, before the next starts.

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::faults::{FaultKind, FaultTarget};

/// What a plan is drawn for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleParams {
    /// The run's length; no fault ends later than this minus `ttl`.
    pub duration: Duration,
    /// The leases' ttl.
    pub ttl: Duration,
    /// How many worker processes there are.
    pub workers: usize,
    /// How many server processes (members, masters, nodes) there are.
    pub members: usize,
    /// The kinds to inject, each applicable to the target.
    pub kinds: Vec<FaultKind>,
}

/// One planned fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedFault {
    /// Since the start of the run.
    pub at: Duration,
    /// The fault.
    pub kind: FaultKind,
    /// The worker (for `terminate-backend`: whose session), or the server member, it acts
    /// on (ignored by `kill-leader` and `failover`,
    /// which act on whichever member leads at that moment; on Sentinel a server fault's
    /// target names a role, master or replica: see `LocalServers::server_for`).
    pub target: usize,
    /// How long it lasts.
    pub length: Duration,
}

impl fmt::Display for PlannedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = match self.kind.target() {
            FaultTarget::Worker | FaultTarget::Proxy | FaultTarget::Session => {
                format!("worker {}", self.target)
            }
            FaultTarget::ServerSignal => format!("server {}", self.target),
            FaultTarget::ServerProcess if self.kind == FaultKind::KillLeader => {
                "the leader".to_string()
            }
            FaultTarget::ServerProcess if self.kind == FaultKind::Failover => {
                "the master".to_string()
            }
            FaultTarget::ServerProcess => format!("server {}", self.target),
        };
        write!(
            f,
            "+{:>8.3}s  {:<18}  {:<10}  for {:.3}s",
            self.at.as_secs_f64(),
            self.kind.name(),
            on,
            self.length.as_secs_f64()
        )
    }
}

/// Draws the plan for `seed`.
///
/// ```
/// use std::time::Duration;
/// use dlock_torture::faults::FaultKind;
/// use dlock_torture::schedule::{plan, ScheduleParams};
/// let params = ScheduleParams {
///     duration: Duration::from_secs(30), ttl: Duration::from_secs(2),
///     workers: 4, members: 3, kinds: vec![FaultKind::KillWorker, FaultKind::Reset],
/// };
/// assert_eq!(plan(7, &params), plan(7, &params));
/// ```
pub fn plan(seed: u64, params: &ScheduleParams) -> Vec<PlannedFault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kinds = params.kinds.clone();
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() {
        return Vec::new();
    }
    let ttl = params.ttl;
    // Let the workers connect and take some locks before the first fault, and leave a ttl
    // at the end for the last fault's consequences to show.
    let mut at = ttl.min(params.duration / 10);
    let end = params.duration.saturating_sub(ttl);
    let mut first_round = kinds.clone();
    first_round.shuffle(&mut rng);
    let mut first_round = first_round.into_iter();
    let mut planned = Vec::new();
    loop {
        let kind = match first_round.next() {
            Some(kind) => kind,
            None => kinds[rng.random_range(0..kinds.len())],
        };
        let (low, high) = kind.length_range(ttl);
        let length = low + (high - low).mul_f64(rng.random_range(0.0..1.0));
        let targets = match kind.target() {
            FaultTarget::Worker | FaultTarget::Proxy | FaultTarget::Session => params.workers,
            FaultTarget::ServerSignal | FaultTarget::ServerProcess => params.members,
        };
        let target = rng.random_range(0..targets.max(1));
        if at + length > end {
            break;
        }
        planned.push(PlannedFault {
            at,
            kind,
            target,
            length,
        });
        at += length + ttl.mul_f64(rng.random_range(0.25..0.5));
    }
    planned
}
