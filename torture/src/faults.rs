//! The fault kinds the nemesis injects, how long each lasts, and what it needs to act on.

use std::fmt;
use std::time::Duration;

/// One kind of fault. `--faults` takes their names, comma separated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGSTOP a worker for less than its ttl, then SIGCONT.
    PauseWorkerShort,
    /// SIGSTOP a worker for longer than its ttl, then SIGCONT.
    PauseWorkerLong,
    /// SIGKILL a worker; it is started again.
    KillWorker,
    /// Blackhole a worker's connections to the servers (its fault proxy drops every byte).
    Blackhole,
    /// Reset a worker's connections (its fault proxy resets current and new ones).
    Reset,
    /// SIGSTOP a server (one member of a set) for less than the ttl.
    PauseServerShort,
    /// SIGSTOP a server (one member of a set) for longer than the ttl.
    PauseServerLong,
    /// SIGKILL the leader of an etcd or ZooKeeper ensemble; it is started again later.
    KillLeader,
    /// Restart a Redis server (one master of a set) without persistence: it forgets its
    /// locks, a loss the README documents, counted apart as expected.
    RestartServer,
    /// Redis Sentinel only: SIGKILL the current master, wait for the sentinels to promote
    /// the replica, then start the old master again as a replica of the new one and wait
    /// until it has synced, so that the next failover has a replica to promote.
    Failover,
    /// PostgreSQL and MySQL only: the server ends one of a worker's sessions
    /// (`pg_terminate_backend`, one holding advisory locks if it has one; MariaDB: `KILL`
    /// of a session holding a named lock if one does): the server frees that session's
    /// locks at once, and the worker learns it at its next renewal.
    TerminateBackend,
    /// File backend only: one held lock file (a worker's if it holds one) is removed, or
    /// replaced by a new empty file renamed over it (`force_release`'s way), alternately.
    /// The next acquirer locks a new file at once; the holder learns it at its next
    /// renewal, which finds its file gone or replaced.
    ReplaceLockFile,
    /// Freeze a worker's connections for good (its fault proxies drop every byte of the
    /// flows open now, without a FIN or RST, while new connections pass): a NAT or load
    /// balancer that forgot the flows. The worker must notice and open new ones. Last in
    /// the order and not in [`FaultKind::DEFAULT`], so the seeded plans of the default
    /// set stay what they were.
    FreezeFlows,
}

/// What a fault acts on, which decides where it can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultTarget {
    /// A worker process: always possible.
    Worker,
    /// A worker's fault proxy: needs servers on loopback and a client that keeps to the
    /// addresses it was given.
    Proxy,
    /// A server process by signal: needs its pid (`--server-pid`) or `--local`.
    ServerSignal,
    /// A server process stopped and started again: needs `--local`.
    ServerProcess,
    /// A worker's hold taken from outside: its session on the server ended by the server
    /// (SQL as the superuser: `--local postgres` or `--local mysql`), or its lock file
    /// removed or replaced (`--local file`).
    Session,
}

impl FaultKind {
    /// Every kind, in the order reports list them (`--faults all`): the default set, then
    /// the kinds asked for by name.
    pub const ALL: [FaultKind; 13] = {
        let mut all = [FaultKind::FreezeFlows; 13];
        let mut i = 0;
        while i < FaultKind::DEFAULT.len() {
            all[i] = FaultKind::DEFAULT[i];
            i += 1;
        }
        all
    };

    /// The kinds a run injects without `--faults`: all but `freeze-flows`, which is asked
    /// for by name (a new kind in the default set would change every seeded plan). A kind
    /// that applies to one backend only (`terminate-backend`, `replace-lock-file`) is
    /// left out of the others' plans before drawing, so it changes no other plan.
    pub const DEFAULT: [FaultKind; 12] = [
        FaultKind::PauseWorkerShort,
        FaultKind::PauseWorkerLong,
        FaultKind::KillWorker,
        FaultKind::Blackhole,
        FaultKind::Reset,
        FaultKind::PauseServerShort,
        FaultKind::PauseServerLong,
        FaultKind::KillLeader,
        FaultKind::RestartServer,
        FaultKind::Failover,
        FaultKind::TerminateBackend,
        FaultKind::ReplaceLockFile,
    ];

    /// The name `--faults` and the report use.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::PauseWorkerShort => "pause-worker-short",
            FaultKind::PauseWorkerLong => "pause-worker-long",
            FaultKind::KillWorker => "kill-worker",
            FaultKind::Blackhole => "blackhole",
            FaultKind::Reset => "reset",
            FaultKind::PauseServerShort => "pause-server-short",
            FaultKind::PauseServerLong => "pause-server-long",
            FaultKind::KillLeader => "kill-leader",
            FaultKind::RestartServer => "restart-server",
            FaultKind::Failover => "failover",
            FaultKind::TerminateBackend => "terminate-backend",
            FaultKind::ReplaceLockFile => "replace-lock-file",
            FaultKind::FreezeFlows => "freeze-flows",
        }
    }

    /// The kind named `name`, if any.
    pub fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What the fault acts on.
    pub fn target(self) -> FaultTarget {
        match self {
            FaultKind::PauseWorkerShort | FaultKind::PauseWorkerLong | FaultKind::KillWorker => {
                FaultTarget::Worker
            }
            FaultKind::Blackhole | FaultKind::Reset | FaultKind::FreezeFlows => FaultTarget::Proxy,
            FaultKind::PauseServerShort | FaultKind::PauseServerLong => FaultTarget::ServerSignal,
            FaultKind::KillLeader | FaultKind::RestartServer | FaultKind::Failover => {
                FaultTarget::ServerProcess
            }
            FaultKind::TerminateBackend | FaultKind::ReplaceLockFile => FaultTarget::Session,
        }
    }

    /// The range a fault's length is drawn from, for leases of `ttl`: "short" stays below
    /// the ttl and "long" above it, so each kind tests the side of the ttl it names.
    pub fn length_range(self, ttl: Duration) -> (Duration, Duration) {
        let f = |x: f64| ttl.mul_f64(x);
        match self {
            FaultKind::PauseWorkerShort | FaultKind::PauseServerShort => (f(0.25), f(0.6)),
            FaultKind::PauseWorkerLong | FaultKind::PauseServerLong => (f(1.5), f(2.0)),
            // how long the worker stays dead before it is started again
            FaultKind::KillWorker => (f(0.1), f(0.5)),
            FaultKind::Blackhole => (f(1.2), f(1.8)),
            FaultKind::Reset => (f(0.25), f(0.75)),
            // the settling time after the freeze: the worker's clients notice a silent
            // connection within their request timeouts (5 s by default) and open new ones
            FaultKind::FreezeFlows => (f(2.0), f(3.0)),
            // how long the old leader stays down (an election needs about a second here)
            FaultKind::KillLeader => (f(1.0), f(1.5)),
            // stop, then start again at once (end a session at once, replace a file): the
            // length is only the settling time after it
            FaultKind::RestartServer | FaultKind::TerminateBackend | FaultKind::ReplaceLockFile => {
                (f(0.25), f(0.5))
            }
            // The whole window budgeted for a failover, from the kill to the old master
            // synced as a replica; whatever it leaves over is settling time. It is the
            // sentinels' clock, not the leases': down-after 1 s, a vote and a promotion
            // (2-3 s together), then 2-3 s before a sentinel converts the returning node
            // and a full sync. So it is drawn from 6-8 s whatever the ttl, or 3-4 ttl if
            // that is longer (the lost leases of a long ttl must show within the window).
            FaultKind::Failover => (
                f(3.0).max(Duration::from_secs(6)),
                f(4.0).max(Duration::from_secs(8)),
            ),
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses `--faults`: `all`, `none`, or names separated by commas.
///
/// ```
/// use dlock_torture::faults::{parse_fault_list, FaultKind};
/// assert_eq!(parse_fault_list("reset,kill-worker").unwrap(), vec![FaultKind::KillWorker, FaultKind::Reset]);
/// assert_eq!(parse_fault_list("all").unwrap().len(), FaultKind::ALL.len());
/// assert!(parse_fault_list("pause").unwrap_err().contains("pause-worker-short"));
/// ```
///
/// # Errors
/// An unknown name, with the list of valid names.
pub fn parse_fault_list(list: &str) -> Result<Vec<FaultKind>, String> {
    match list.trim() {
        "all" => return Ok(FaultKind::ALL.to_vec()),
        "none" | "" => return Ok(Vec::new()),
        _ => {}
    }
    let mut kinds = Vec::new();
    for name in list.split(',').map(str::trim) {
        let kind = FaultKind::from_name(name).ok_or_else(|| {
            let valid: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
            format!(
                "unknown fault `{name}` in `--faults`; valid: all, none, {}",
                valid.join(", ")
            )
        })?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds.sort();
    Ok(kinds)
}
