//! The nemesis: runs a [`PlannedFault`] list against the workers, their proxies and the
//! servers, one fault at a time, and records what it did, when, and what failed.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dlock_tests::proxy::{FaultProxy, ProxyMode};
use nix::sys::signal::Signal;

use crate::clock::now_ns;
use crate::faults::{FaultKind, FaultTarget};
use crate::schedule::PlannedFault;
use crate::targets::{signal_pid, ServerSide, WorkerPool};

/// A fault as it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    /// The plan's entry.
    pub planned: PlannedFault,
    /// What it acted on, in words (`worker 2`, `server 1 (leader)`).
    pub on: String,
    /// The worker it acted on (worker and proxy faults; `terminate-backend`: the worker
    /// whose session the server ended).
    pub worker: Option<usize>,
    /// When it began (monotonic ns).
    pub start_ns: u64,
    /// When it was undone.
    pub end_ns: u64,
    /// Whether it made a server forget locks before their leases ran out: `restart-server`
    /// of a Redis master without persistence; on PostgreSQL and MySQL, whose locks live in
    /// sessions, every fault that ends a session at once (`restart-server`,
    /// `terminate-backend`, `reset`; on MySQL also `kill-leader`, kill -9 of the server);
    /// on the file backend, a lock file taken away (`replace-lock-file`). A late `lost()` in its window is excused as that documented loss (the
    /// holder learns it at its next renewal). Not a Sentinel replica's restart, which
    /// loses no lock.
    pub forgets_locks: bool,
    /// On Sentinel: the master before and after the fault, when they differ (a `failover`,
    /// or a master paused past the sentinels' `down-after`).
    pub failed_over: Option<(usize, usize)>,
    /// `Err` with the reason if it could not be injected or undone.
    pub outcome: Result<(), String>,
}

impl fmt::Display for Injected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let outcome = match &self.outcome {
            Ok(()) => "done".to_string(),
            Err(e) => format!("FAILED: {e}"),
        };
        write!(
            f,
            "{:<18}  {:<20}  {:.3}s  {}",
            self.planned.kind.name(),
            self.on,
            (self.end_ns.saturating_sub(self.start_ns)) as f64 / 1e9,
            outcome
        )?;
        match self.failed_over {
            Some((old, new)) if self.planned.kind != FaultKind::Failover => {
                write!(f, " (the sentinels failed over: master {old} -> {new})")
            }
            _ => Ok(()),
        }
    }
}

/// Bound of each step of a `failover` (the promotion; the old master's sync as a
/// replica) and of the wait after a server fault on Sentinel for the group to heal.
pub const SENTINEL_STEP_LIMIT: Duration = Duration::from_secs(20);

/// What the nemesis acts on.
pub struct Nemesis {
    /// The worker processes.
    pub pool: Arc<Mutex<WorkerPool>>,
    /// Each worker's proxies, one per server address (empty where proxies do not apply).
    pub proxies: Vec<Vec<Arc<FaultProxy>>>,
    /// The servers.
    pub servers: ServerSide,
    /// Whether the servers free a client's locks when its connection ends (PostgreSQL's
    /// session advisory locks, MySQL's named locks), so that a `reset` makes them forget
    /// the worker's locks.
    pub connection_bound_locks: bool,
}

impl Nemesis {
    /// Runs `plan`, each fault at `run_start_ns + at` (or as soon as the previous one is
    /// undone, if that is later). Returns what happened, in order.
    pub fn run(&mut self, plan: &[PlannedFault], run_start_ns: u64) -> Vec<Injected> {
        let mut done = Vec::with_capacity(plan.len());
        for planned in plan {
            let due = run_start_ns + u64::try_from(planned.at.as_nanos()).unwrap_or(u64::MAX);
            let now = now_ns();
            if due > now {
                thread::sleep(Duration::from_nanos(due - now));
            }
            done.push(self.inject(*planned));
        }
        done
    }

    /// Injects one fault, waits its length, undoes it.
    pub fn inject(&mut self, planned: PlannedFault) -> Injected {
        let start_ns = now_ns();
        let on_worker = matches!(
            planned.kind.target(),
            FaultTarget::Worker | FaultTarget::Proxy | FaultTarget::Session
        );
        let mut on = if on_worker {
            format!("worker {}", planned.target)
        } else {
            format!("server {}", planned.target)
        };
        let mut worker = on_worker.then_some(planned.target);
        let mut forgets_locks = false;
        let master_before = self.master();
        let outcome = self.apply(planned, &mut on, &mut worker, &mut forgets_locks);
        let failed_over = match (master_before, self.master()) {
            (Some(a), Some(b)) if a != b => Some((a, b)),
            _ => None,
        };
        Injected {
            planned,
            on,
            worker,
            start_ns,
            end_ns: now_ns(),
            forgets_locks,
            failed_over,
            outcome,
        }
    }

    fn apply(
        &mut self,
        planned: PlannedFault,
        on: &mut String,
        worker: &mut Option<usize>,
        forgets_locks: &mut bool,
    ) -> Result<(), String> {
        let i = planned.target;
        let length = planned.length;
        match planned.kind {
            FaultKind::PauseWorkerShort | FaultKind::PauseWorkerLong => {
                let pid = self
                    .pool()
                    .pid(i)
                    .ok_or_else(|| format!("worker {i} is not running"))?;
                signal_pid(pid, Signal::SIGSTOP)?;
                thread::sleep(length);
                signal_pid(pid, Signal::SIGCONT)
            }
            FaultKind::KillWorker => {
                self.pool().kill(i)?;
                thread::sleep(length);
                self.pool().spawn(i)
            }
            FaultKind::Blackhole | FaultKind::Reset => {
                let proxies = self
                    .proxies
                    .get(i)
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| format!("worker {i} has no fault proxy"))?;
                let mode = if planned.kind == FaultKind::Blackhole {
                    ProxyMode::Blackhole
                } else {
                    ProxyMode::Reset
                };
                proxies.iter().for_each(|p| p.set_mode(mode));
                *forgets_locks = mode == ProxyMode::Reset && self.connection_bound_locks;
                thread::sleep(length);
                proxies.iter().for_each(|p| p.pass());
                Ok(())
            }
            FaultKind::FreezeFlows => {
                let proxies = self
                    .proxies
                    .get(i)
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| format!("worker {i} has no fault proxy"))?;
                // For good: nothing to undo. The window is the worker's time to notice.
                proxies.iter().for_each(|p| p.freeze_flows());
                thread::sleep(length);
                Ok(())
            }
            FaultKind::PauseServerShort | FaultKind::PauseServerLong => match &mut self.servers {
                ServerSide::Local(servers) => {
                    let (node, name) = servers.server_for(planned.kind, i)?;
                    *on = name;
                    servers.pause(node)?;
                    thread::sleep(length);
                    servers.resume(node)?;
                    servers.settle(SENTINEL_STEP_LIMIT)
                }
                ServerSide::Pids(pids) => {
                    let (addr, pid) = pids
                        .get(i)
                        .cloned()
                        .ok_or_else(|| format!("no server {i}"))?;
                    *on = format!("server {addr} (pid {pid})");
                    signal_pid(pid, Signal::SIGSTOP)?;
                    thread::sleep(length);
                    signal_pid(pid, Signal::SIGCONT)
                }
            },
            FaultKind::KillLeader => {
                let ServerSide::Local(servers) = &mut self.servers else {
                    return Err("kill-leader needs `--local`".into());
                };
                let leader = servers.leader(Duration::from_secs(10))?;
                *forgets_locks = servers.kill_forgets_locks();
                *on = if servers.members() == 1 {
                    format!("server {leader} (kill -9)")
                } else {
                    format!("server {leader} (leader)")
                };
                servers.kill(leader)?;
                thread::sleep(length);
                servers.start_again(leader)
            }
            FaultKind::RestartServer => {
                let ServerSide::Local(servers) = &mut self.servers else {
                    return Err("restart-server needs `--local`".into());
                };
                let (node, name) = servers.server_for(planned.kind, i)?;
                *on = name;
                *forgets_locks = servers.restart_forgets_locks();
                servers.restart(node)?;
                thread::sleep(length);
                servers.settle(SENTINEL_STEP_LIMIT)
            }
            FaultKind::TerminateBackend => {
                let ServerSide::Local(servers) = &mut self.servers else {
                    return Err(
                        "terminate-backend needs `--local postgres` or `--local mysql`".into(),
                    );
                };
                *forgets_locks = true;
                (*worker, *on) = servers
                    .end_session(i)?
                    .unwrap_or((None, "no worker session".into()));
                thread::sleep(length);
                Ok(())
            }
            FaultKind::ReplaceLockFile => {
                let ServerSide::Local(servers) = &mut self.servers else {
                    return Err("replace-lock-file needs `--local file`".into());
                };
                // The holder learns it at its next renewal (a third of the ttl), while a
                // waiter, woken by the removal or rename, may take the new file at once:
                // a loss the backend documents, excused as a forgotten lock is.
                *forgets_locks = true;
                (*worker, *on) = servers
                    .replace_lock_file(i)?
                    .unwrap_or((None, "no lock file held".into()));
                thread::sleep(length);
                Ok(())
            }
            FaultKind::Failover => {
                let ServerSide::Local(servers) = &mut self.servers else {
                    return Err("failover needs `--local sentinel`".into());
                };
                *on = "the master".into();
                let started = Instant::now();
                let (old, new) = servers.failover(SENTINEL_STEP_LIMIT)?;
                *on = format!(
                    "master {old} -> {new}, whole in {:.1}s",
                    started.elapsed().as_secs_f64()
                );
                // the rest of the planned window lets the group and the workers settle
                thread::sleep(length.saturating_sub(started.elapsed()));
                Ok(())
            }
        }
    }

    /// The Sentinel master now (`None` elsewhere, or if no sentinel answers).
    fn master(&self) -> Option<usize> {
        match &self.servers {
            ServerSide::Local(servers) => servers.master(),
            ServerSide::Pids(_) => None,
        }
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, WorkerPool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }
}
