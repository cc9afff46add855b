//! What the nemesis acts on: the worker processes (started, signalled, restarted here),
//! and the servers, either started by the run (`--local`) or the user's, by pid.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dlock_tests::servers::{
    EtcdCluster, RedisCluster, RedisOptions, RedisServer, RedisSet, ServerControl, ZkEnsemble,
    ZkOptions,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::events::Event;
use crate::faults::{FaultKind, FaultTarget};
use crate::options::{LocalKind, WorkerOptions};
use crate::urls::ServiceUrl;

/// One event with the worker process that reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEvent {
    /// Worker number.
    pub worker: usize,
    /// Which start of that worker.
    pub incarnation: u32,
    /// The event.
    pub event: Event,
}

/// Every event reported so far, in arrival order per worker.
pub type EventLog = Arc<Mutex<Vec<WorkerEvent>>>;

struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: thread::JoinHandle<()>,
}

/// The worker processes: `torture worker …` children of the run.
pub struct WorkerPool {
    exe: PathBuf,
    options: Vec<WorkerOptions>,
    running: Vec<Option<Running>>,
    logs: PathBuf,
    events: EventLog,
}

impl WorkerPool {
    /// A pool that starts `exe worker <options>` for each entry of `options`, their stderr
    /// appended to `logs/worker-<id>.log`.
    pub fn new(exe: PathBuf, options: Vec<WorkerOptions>, logs: &Path, events: EventLog) -> Self {
        let running = options.iter().map(|_| None).collect();
        Self {
            exe,
            options,
            running,
            logs: logs.to_path_buf(),
            events,
        }
    }

    /// How many workers there are.
    pub fn len(&self) -> usize {
        self.options.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.options.is_empty()
    }

    /// Starts worker `i` (again, with the next incarnation if it ran before).
    ///
    /// # Errors
    /// The process could not be started.
    pub fn spawn(&mut self, i: usize) -> Result<(), String> {
        if self.running[i].is_some() {
            return Err(format!("worker {i} is already running"));
        }
        let options = self.options[i].clone();
        let log_path = self.logs.join(format!("worker-{i}.log"));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("open {}: {e}", log_path.display()))?;
        let mut child = Command::new(&self.exe)
            .arg("worker")
            .args(options.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("start worker {i} ({}): {e}", self.exe.display()))?;
        let stdout = child.stdout.take().ok_or("worker stdout")?;
        let stdin = child.stdin.take();
        let events = Arc::clone(&self.events);
        let incarnation = options.incarnation;
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(event) = Event::parse(&line) {
                    events
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(WorkerEvent {
                            worker: i,
                            incarnation,
                            event,
                        });
                }
            }
        });
        self.running[i] = Some(Running {
            child,
            stdin,
            reader,
        });
        self.options[i].incarnation += 1;
        Ok(())
    }

    /// The pid of worker `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.running[i].as_ref().map(|r| r.child.id())
    }

    /// Sends `signal` to worker `i`.
    ///
    /// # Errors
    /// The worker is not running or the signal failed.
    pub fn signal(&self, i: usize, signal: Signal) -> Result<(), String> {
        let pid = self
            .pid(i)
            .ok_or_else(|| format!("worker {i} is not running"))?;
        signal_pid(pid, signal)
    }

    /// SIGKILLs worker `i` and reaps it.
    ///
    /// # Errors
    /// The worker is not running.
    pub fn kill(&mut self, i: usize) -> Result<(), String> {
        let mut running = self.running[i]
            .take()
            .ok_or_else(|| format!("worker {i} is not running"))?;
        let _ = running.child.kill();
        let _ = running.child.wait();
        let _ = running.reader.join();
        Ok(())
    }

    /// Asks every worker to stop (their stdin closes; each finishes its round), waits up to
    /// `limit`, then SIGKILLs the ones still running (SIGCONT first, in case one is
    /// paused).
    pub fn stop_all(&mut self, limit: Duration) -> Stopped {
        for running in self.running.iter_mut().flatten() {
            let _ = kill(pid_of(running.child.id()), Signal::SIGCONT);
            running.stdin = None;
        }
        let started = Instant::now();
        let mut stopped = Stopped::default();
        for (i, slot) in self.running.iter_mut().enumerate() {
            let Some(mut running) = slot.take() else {
                continue;
            };
            loop {
                match running.child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            stopped.failed.push(format!(
                                "worker {i} exited with {status} (see worker-{i}.log)"
                            ));
                        }
                        break;
                    }
                    Ok(None) if started.elapsed() < limit => {
                        thread::sleep(Duration::from_millis(20));
                    }
                    _ => {
                        let _ = running.child.kill();
                        let _ = running.child.wait();
                        stopped.killed += 1;
                        break;
                    }
                }
            }
            let _ = running.reader.join();
        }
        stopped
    }
}

/// How the workers stopped at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Workers still running after the limit, killed.
    pub killed: usize,
    /// Workers that had exited with an error (e.g. the store failed them), in words.
    pub failed: Vec<String>,
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        for running in self.running.iter_mut().flatten() {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

/// Sends `signal` to process `pid`.
///
/// # Errors
/// The process does not exist or may not be signalled by this user.
pub fn signal_pid(pid: u32, signal: Signal) -> Result<(), String> {
    kill(pid_of(pid), signal).map_err(|e| format!("{signal} to pid {pid}: {e}"))
}

/// Servers started by the run, on free loopback ports, stopped when dropped.
pub enum LocalServers {
    /// One Redis server.
    Redis(Box<RedisServer>),
    /// A Redis Cluster of 3 masters.
    Cluster(RedisCluster),
    /// 5 Redis masters for Redlock.
    Redlock(RedisSet),
    /// 3 etcd members.
    Etcd(EtcdCluster),
    /// 3 ZooKeeper nodes.
    Zk(ZkEnsemble),
}

impl LocalServers {
    /// Starts the servers of `kind` (blocks until they are ready: seconds).
    ///
    /// # Errors
    /// A server binary is missing (the message names the install command) or a server did
    /// not start.
    pub fn start(kind: LocalKind) -> Result<Self, String> {
        let started = match kind {
            LocalKind::Redis => {
                RedisServer::try_start_with(RedisOptions::new()).map(|s| Self::Redis(Box::new(s)))
            }
            LocalKind::Cluster => {
                RedisCluster::try_start_with(3, RedisOptions::new()).map(Self::Cluster)
            }
            LocalKind::Redlock => {
                RedisSet::try_start_with(5, RedisOptions::new()).map(Self::Redlock)
            }
            LocalKind::Etcd => EtcdCluster::try_start(3).map(Self::Etcd),
            LocalKind::Zk => ZkEnsemble::try_start_with(3, ZkOptions::default()).map(Self::Zk),
        };
        started.map_err(|e| e.to_string())
    }

    /// The URL for dlock. ZooKeeper's asks for a session of twice the ttl, so that a
    /// killed or paused worker's nodes go within the run (dlock clamps the lease to 11/20
    /// of the session).
    pub fn url(&self, ttl: Duration) -> String {
        match self {
            Self::Redis(s) => s.url(),
            Self::Cluster(c) => c.url(),
            Self::Redlock(s) => s.url(),
            Self::Etcd(c) => c.url(),
            Self::Zk(z) => format!("{}?session_timeout={}ms", z.url(), ttl.as_millis() * 2),
        }
    }

    /// How many server processes.
    pub fn members(&self) -> usize {
        match self {
            Self::Redis(_) => 1,
            Self::Cluster(c) => c.nodes().len(),
            Self::Redlock(s) => s.len(),
            Self::Etcd(c) => c.len(),
            Self::Zk(z) => z.len(),
        }
    }

    fn member(&mut self, i: usize) -> &mut dyn ServerControl {
        match self {
            Self::Redis(s) => s.as_mut(),
            Self::Cluster(c) => c.node_mut(i),
            Self::Redlock(s) => s.server_mut(i),
            Self::Etcd(c) => c.member_mut(i),
            Self::Zk(z) => z.node_mut(i),
        }
    }

    /// Why `kind` cannot run on these servers, if it cannot.
    pub fn not_applicable(&self, kind: FaultKind) -> Option<String> {
        let consensus = matches!(self, Self::Etcd(_) | Self::Zk(_));
        match kind {
            FaultKind::KillLeader if !consensus => {
                Some("Redis has no leader to kill (kill-leader is for etcd and ZooKeeper)".into())
            }
            FaultKind::RestartServer if consensus => Some(
                "etcd and ZooKeeper keep their data across a restart; restart-server is the Redis fault of losing it".into(),
            ),
            _ => None,
        }
    }

    /// SIGSTOPs member `i` (waits until it is stopped).
    ///
    /// # Errors
    /// The member is not running.
    pub fn pause(&mut self, i: usize) -> Result<(), String> {
        self.member(i)
            .process_mut()
            .pause()
            .map_err(|e| e.to_string())
    }

    /// SIGCONTs member `i`.
    ///
    /// # Errors
    /// The member is not running.
    pub fn resume(&mut self, i: usize) -> Result<(), String> {
        self.member(i)
            .process_mut()
            .resume()
            .map_err(|e| e.to_string())
    }

    /// SIGKILLs member `i`.
    ///
    /// # Errors
    /// Reaping it failed.
    pub fn kill(&mut self, i: usize) -> Result<(), String> {
        self.member(i)
            .process_mut()
            .kill9()
            .map_err(|e| e.to_string())
    }

    /// Stops member `i` (SIGTERM; no persistence is configured, so a Redis forgets its
    /// keys), starts it again on the same port and waits until it is ready.
    ///
    /// # Errors
    /// It did not come back.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        let member = self.member(i);
        member.process_mut().stop().map_err(|e| e.to_string())?;
        self.start_again(i)
    }

    /// Starts a stopped or killed member `i` again and waits until it is ready.
    ///
    /// # Errors
    /// It did not come back.
    pub fn start_again(&mut self, i: usize) -> Result<(), String> {
        let member = self.member(i);
        member
            .process_mut()
            .start()
            .and_then(|()| member.wait_ready())
            .map_err(|e| e.to_string())
    }

    /// The member that leads now (etcd, ZooKeeper), waiting up to `limit` for an election.
    ///
    /// # Errors
    /// No leader within `limit`, or these servers have none.
    pub fn leader(&self, limit: Duration) -> Result<usize, String> {
        match self {
            Self::Etcd(c) => c.wait_for_leader(limit).map_err(|e| e.to_string()),
            Self::Zk(z) => z.wait_for_leader(limit).map_err(|e| e.to_string()),
            _ => Err("these servers have no leader".into()),
        }
    }
}

/// The servers as the nemesis sees them.
pub enum ServerSide {
    /// Started by the run: every server fault is possible.
    Local(LocalServers),
    /// The user's, with the pids given by `--server-pid` (index = position in the list):
    /// pauses only.
    Pids(Vec<(String, u32)>),
}

impl ServerSide {
    /// How many server processes the nemesis can pick from.
    pub fn members(&self) -> usize {
        match self {
            ServerSide::Local(l) => l.members(),
            ServerSide::Pids(p) => p.len(),
        }
    }

    /// Why `kind` cannot run here, if it cannot. `url` is what the workers connect to.
    pub fn not_applicable(&self, kind: FaultKind, url: &ServiceUrl) -> Option<String> {
        match kind.target() {
            FaultTarget::Worker => None,
            FaultTarget::Proxy => proxy_not_applicable(url),
            FaultTarget::ServerSignal => match self {
                ServerSide::Local(_) => None,
                ServerSide::Pids(p) if !p.is_empty() => None,
                ServerSide::Pids(_) => Some(
                    "needs the server processes: give `--server-pid ADDR=PID` or use `--local`"
                        .into(),
                ),
            },
            FaultTarget::ServerProcess => match self {
                ServerSide::Local(l) => l.not_applicable(kind),
                ServerSide::Pids(_) => {
                    Some("needs to stop and start the servers: only with `--local`".into())
                }
            },
        }
    }
}

/// Why worker connections cannot go through fault proxies for `url`, if they cannot.
pub fn proxy_not_applicable(url: &ServiceUrl) -> Option<String> {
    if url.scheme == "redis+cluster" {
        return Some(
            "a Redis Cluster client connects to the node addresses the cluster announces (CLUSTER SLOTS), not to the ones in the URL, so a proxy per worker would not be on its path".into(),
        );
    }
    for host in &url.hosts {
        match crate::urls::resolve(host) {
            Some(addr) if addr.ip().is_loopback() => {}
            Some(addr) => {
                return Some(format!(
                    "the fault proxy only forwards to loopback addresses and {host} is {addr}: run torture on the servers' host"
                ))
            }
            None => return Some(format!("cannot resolve {host}")),
        }
    }
    None
}
