//! What the nemesis acts on: the worker processes (started, signalled, restarted here),
//! and the servers, either started by the run (`--local`) or the user's, by pid.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dlock_tests::servers::mariadb::MariaDbServer;
use dlock_tests::servers::{
    EtcdCluster, PgServer, RedisCluster, RedisOptions, RedisSentinel, RedisServer, RedisSet,
    SentinelOptions, ServerControl, ZkEnsemble, ZkOptions,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::events::Event;
use crate::faults::{FaultKind, FaultTarget};
pub use crate::lock_files::LockFiles;
use crate::options::{LocalKind, WorkerOptions};
pub use crate::sessions::application_name;
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
    /// Redis Sentinel: a master, one replica, three sentinels.
    Sentinel(Box<RedisSentinel>),
    /// 3 etcd members.
    Etcd(EtcdCluster),
    /// 3 ZooKeeper nodes.
    Zk(ZkEnsemble),
    /// One PostgreSQL server (the test harness's: `fsync=off`, trust authentication).
    Postgres(Box<PgServer>),
    /// One MariaDB server (the test harness's: root without a password, database `dlock`).
    Mysql(Box<MariaDbServer>),
    /// A temporary directory of lock files: no server (see [`LockFiles`]).
    File(Box<LockFiles>),
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
            LocalKind::Sentinel => RedisSentinel::try_start_with(1, SentinelOptions::new())
                .map(|g| Self::Sentinel(Box::new(g))),
            LocalKind::Etcd => EtcdCluster::try_start(3).map(Self::Etcd),
            LocalKind::Zk => ZkEnsemble::try_start_with(3, ZkOptions::default()).map(Self::Zk),
            LocalKind::Postgres => PgServer::try_start().map(|s| Self::Postgres(Box::new(s))),
            LocalKind::Mysql => MariaDbServer::try_start().map(|s| Self::Mysql(Box::new(s))),
            LocalKind::File => return LockFiles::start().map(|f| Self::File(Box::new(f))),
        };
        started.map_err(|e| e.to_string())
    }

    /// The URL for dlock. ZooKeeper's asks for a session of twice the ttl, so that a
    /// killed or paused worker's nodes go within the run (dlock clamps the lease to 11/20
    /// of the session). PostgreSQL's asks for a `session_timeout` of the ttl: the server
    /// ends a session silent that long (a stopped or vanished worker's) and frees its
    /// locks, so a `pause-worker-long` (1.5-2 ttl) sees its locks taken over while it is
    /// stopped, and the lease's ttl is not capped below the ttl asked for. MySQL's the
    /// same, in whole seconds (its `session_timeout` is the server's `wait_timeout`, at
    /// least 2 s). The file backend's names the directory.
    pub fn url(&self, ttl: Duration) -> String {
        match self {
            Self::Redis(s) => s.url(),
            Self::Cluster(c) => c.url(),
            Self::Redlock(s) => s.url(),
            // the sentinels' addresses and the master's name; `replicas=auto` (the default):
            // every grant and renewal waits for the replica's acknowledgement
            Self::Sentinel(g) => g.url(),
            Self::Etcd(c) => c.url(),
            Self::Zk(z) => format!("{}?session_timeout={}ms", z.url(), ttl.as_millis() * 2),
            Self::Postgres(s) => format!("{}?session_timeout={}ms", s.url(), ttl.as_millis()),
            Self::Mysql(s) => format!(
                "{}?session_timeout={}s",
                s.url(),
                ttl.as_secs_f64().ceil().max(2.0)
            ),
            Self::File(f) => format!("file://{}", f.path().display()),
        }
    }

    /// How many server processes.
    pub fn members(&self) -> usize {
        match self {
            Self::Redis(_) => 1,
            Self::Cluster(c) => c.nodes().len(),
            Self::Redlock(s) => s.len(),
            // the data nodes (the sentinels are not faulted): see `node`
            Self::Sentinel(g) => g.len(),
            Self::Etcd(c) => c.len(),
            Self::Zk(z) => z.len(),
            Self::Postgres(_) | Self::Mysql(_) => 1,
            Self::File(_) => 0,
        }
    }

    fn member(&mut self, i: usize) -> Result<&mut dyn ServerControl, String> {
        Ok(match self {
            Self::Redis(s) => s.as_mut(),
            Self::Cluster(c) => c.node_mut(i),
            Self::Redlock(s) => s.server_mut(i),
            Self::Sentinel(g) => g.node_mut(i),
            Self::Etcd(c) => c.member_mut(i),
            Self::Zk(z) => z.node_mut(i),
            Self::Postgres(s) => s.as_mut(),
            Self::Mysql(s) => s.as_mut(),
            Self::File(_) => return Err("the file backend has no server".into()),
        })
    }

    /// Why `kind` cannot run on these servers, if it cannot.
    pub fn not_applicable(&self, kind: FaultKind) -> Option<String> {
        let consensus = matches!(self, Self::Etcd(_) | Self::Zk(_));
        let sentinel = matches!(self, Self::Sentinel(_));
        let postgres = matches!(self, Self::Postgres(_));
        let mysql = matches!(self, Self::Mysql(_));
        let file = matches!(self, Self::File(_));
        let sessions = postgres || mysql;
        match kind {
            FaultKind::ReplaceLockFile if !file => Some(
                "takes a lock file from its holder: only with `--local file`".into(),
            ),
            FaultKind::ReplaceLockFile => None,
            _ if file && kind.target() != FaultTarget::Worker => Some(
                "the file backend has no server and no network: its locks are the kernel's (flock), freed when the holder process dies".into(),
            ),
            // one MariaDB: kill -9 the server, start it again after the fault's length
            FaultKind::KillLeader if mysql => None,
            FaultKind::KillLeader if sentinel => Some(
                "killing the Sentinel master is the `failover` fault (the sentinels promote the replica; the old master comes back as a replica)".into(),
            ),
            FaultKind::KillLeader if postgres => Some(
                "one PostgreSQL server has no leader to kill (kill-leader is for etcd and ZooKeeper)".into(),
            ),
            FaultKind::KillLeader if !consensus => {
                Some("Redis has no leader to kill (kill-leader is for etcd and ZooKeeper)".into())
            }
            FaultKind::RestartServer if consensus => Some(
                "etcd and ZooKeeper keep their data across a restart; restart-server is the Redis fault of losing it".into(),
            ),
            FaultKind::Failover if !sentinel => Some(
                "needs a Redis Sentinel deployment to promote a replica: only with `--local sentinel`".into(),
            ),
            FaultKind::TerminateBackend if !sessions => Some(
                "ends a PostgreSQL or MySQL session (`pg_terminate_backend`, `KILL`): only with `--local postgres` or `--local mysql`".into(),
            ),
            _ => None,
        }
    }

    /// The server process a server fault planned on `target` acts on, and how the report
    /// names it; resolved once per fault, so that the node paused is the node resumed
    /// even if the sentinels fail over meanwhile.
    ///
    /// Everywhere but Sentinel, `target` is the member. On Sentinel the two data nodes
    /// trade roles at each failover, so `target` names a *role*, looked up (from the
    /// sentinels) when the fault begins: an even target is the current master, an odd
    /// one the current replica. Both stay meaningful there:
    ///
    /// - pausing the master for less than `down-after` (1 s) is a stall that every client
    ///   waits out; for longer, the sentinels fail over to the replica while the old
    ///   master is frozen with its clients' requests in its buffers, and it wakes up
    ///   still a master until a sentinel converts it: the split-brain window that
    ///   replica acknowledgement (`WAIT`) and fencing are there for;
    /// - pausing the replica makes every grant and renewal wait for an acknowledgement
    ///   that does not come (`replicas=auto` counts it as connected until the master
    ///   drops its link), so leases cannot be renewed: an availability fault;
    /// - `restart-server` restarts the current *replica* whatever the target: it loses
    ///   its copy and syncs it again in full (meanwhile `replicas=auto` finds no replica
    ///   connected and grants go unacknowledged). Not the master: a master without
    ///   persistence that comes back empty before the sentinels notice wipes its replica
    ///   too (the setup Redis' replication docs warn against, not a Sentinel fault), and
    ///   the harness starts a node with its first command line, so a promoted node would
    ///   come back as a replica of its own replica. Killing the master is `failover`.
    ///
    /// # Errors
    /// No sentinel names a master.
    pub fn server_for(&self, kind: FaultKind, target: usize) -> Result<(usize, String), String> {
        let Self::Sentinel(g) = self else {
            return Ok((target, format!("server {target}")));
        };
        let master = g.try_master_index().map_err(|e| e.to_string())?;
        let replica = (0..g.len()).find(|&i| i != master).unwrap_or(master);
        let restart = kind == FaultKind::RestartServer;
        if target.is_multiple_of(2) && !restart {
            Ok((master, format!("server {master} (master)")))
        } else {
            Ok((replica, format!("server {replica} (replica)")))
        }
    }

    /// The data node the sentinels name master now; `None` if these are not Sentinel or
    /// no sentinel answers.
    pub fn master(&self) -> Option<usize> {
        match self {
            Self::Sentinel(g) => g.try_master_index().ok(),
            _ => None,
        }
    }

    /// Whether `restart-server` on this member makes the servers forget locks (so that a
    /// late `lost()` meanwhile is excused as the documented loss). On Sentinel it never
    /// does: it restarts the replica, which syncs the locks again (see
    /// [`LocalServers::server_for`]). On PostgreSQL it does: a restart ends every session,
    /// and advisory locks live in sessions (the fence counters, a logged table, stay).
    pub fn restart_forgets_locks(&self) -> bool {
        !matches!(self, Self::Sentinel(_))
    }

    /// After a server fault on Sentinel: waits (up to `limit`) until every data node but
    /// the master the sentinels name replicates from it and has acknowledged everything,
    /// so that the next fault starts from a group that can fail over (a paused master may
    /// have been replaced meanwhile and must be converted into a replica first).
    /// Elsewhere: nothing to wait for.
    ///
    /// # Errors
    /// The group did not heal within `limit`.
    pub fn settle(&mut self, limit: Duration) -> Result<(), String> {
        match self {
            Self::Sentinel(g) => g.wait_replicas_synced(limit).map_err(|e| e.to_string()),
            _ => Ok(()),
        }
    }

    /// The `failover` fault: SIGKILLs the master the sentinels name, waits (up to
    /// `limit`) until they agree on the replica as the new master and it says so itself,
    /// then starts the old master again, waits until the sentinels have converted it into
    /// a replica of the new one and it has synced (each step bounded by the harness).
    /// Returns the old and the new master's index.
    ///
    /// # Errors
    /// Not Sentinel, or a step did not complete in its time (the harness's error quotes
    /// the servers' logs).
    pub fn failover(&mut self, limit: Duration) -> Result<(usize, usize), String> {
        let Self::Sentinel(g) = self else {
            return Err("failover needs `--local sentinel`".into());
        };
        let text = |e: dlock_tests::error::HarnessError| e.to_string();
        let old_addr = g.try_master_addr().map_err(text)?;
        let old = g.try_master_index().map_err(text)?;
        g.node_mut(old)
            .process_mut()
            .kill9()
            .map_err(|e| e.to_string())?;
        let new = g.wait_failover(old_addr, limit).map_err(text)?;
        g.restart_as_replica(old).map_err(text)?;
        g.wait_replicas_synced(limit).map_err(text)?;
        Ok((old, new))
    }

    /// SIGSTOPs member `i` (waits until it is stopped). PostgreSQL: the postmaster and
    /// every process it forked (a session is a backend process of its own, so stopping
    /// the postmaster alone would freeze no session).
    ///
    /// # Errors
    /// The member is not running.
    pub fn pause(&mut self, i: usize) -> Result<(), String> {
        if let Self::Postgres(s) = self {
            return s.try_pause_all().map_err(|e| e.to_string());
        }
        self.member(i)?
            .process_mut()
            .pause()
            .map_err(|e| e.to_string())
    }

    /// SIGCONTs member `i` (PostgreSQL: its backends, then the postmaster).
    ///
    /// # Errors
    /// The member is not running.
    pub fn resume(&mut self, i: usize) -> Result<(), String> {
        if let Self::Postgres(s) = self {
            return s.try_resume_all().map_err(|e| e.to_string());
        }
        self.member(i)?
            .process_mut()
            .resume()
            .map_err(|e| e.to_string())
    }

    /// SIGKILLs member `i`.
    ///
    /// # Errors
    /// Reaping it failed.
    pub fn kill(&mut self, i: usize) -> Result<(), String> {
        self.member(i)?
            .process_mut()
            .kill9()
            .map_err(|e| e.to_string())
    }

    /// Stops member `i` (SIGTERM; no persistence is configured, so a Redis forgets its
    /// keys), starts it again on the same port and waits until it is ready. PostgreSQL:
    /// a fast shutdown (SIGINT: every session ends at once, where SIGTERM's smart shutdown
    /// would wait for the clients to leave), then the same port and data directory.
    /// MariaDB: SIGTERM ends every session (their named locks with them) and shuts the
    /// server down; it comes back on the same port and data directory (the fence rows stay).
    ///
    /// # Errors
    /// It did not come back.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if let Self::Postgres(s) = self {
            return s.try_fast_restart().map_err(|e| e.to_string());
        }
        let member = self.member(i)?;
        member.process_mut().stop().map_err(|e| e.to_string())?;
        self.start_again(i)
    }

    /// Starts a stopped or killed member `i` again and waits until it is ready.
    ///
    /// # Errors
    /// It did not come back.
    pub fn start_again(&mut self, i: usize) -> Result<(), String> {
        let member = self.member(i)?;
        member
            .process_mut()
            .start()
            .and_then(|()| member.wait_ready())
            .map_err(|e| e.to_string())
    }

    /// The `replace-lock-file` fault (see [`LockFiles::replace_held`]).
    ///
    /// # Errors
    /// Not `--local file`, or the file could not be removed or replaced.
    pub fn replace_lock_file(
        &mut self,
        worker: usize,
    ) -> Result<Option<(Option<usize>, String)>, String> {
        match self {
            Self::File(files) => files.replace_held(worker),
            _ => Err("replace-lock-file needs `--local file`".into()),
        }
    }

    /// The member that leads now (etcd, ZooKeeper), waiting up to `limit` for an election;
    /// the one MariaDB server (`kill-leader` there is kill -9 of the server).
    ///
    /// # Errors
    /// No leader within `limit`, or these servers have none.
    pub fn leader(&self, limit: Duration) -> Result<usize, String> {
        match self {
            Self::Etcd(c) => c.wait_for_leader(limit).map_err(|e| e.to_string()),
            Self::Zk(z) => z.wait_for_leader(limit).map_err(|e| e.to_string()),
            Self::Mysql(_) => Ok(0),
            _ => Err("these servers have no leader".into()),
        }
    }

    /// Whether SIGKILLing a member makes the servers forget locks: on MariaDB, whose
    /// named locks live in sessions, every session ends with the server (the fence rows,
    /// InnoDB's, stay). Not on etcd or ZooKeeper, which keep their data.
    pub fn kill_forgets_locks(&self) -> bool {
        matches!(self, Self::Mysql(_))
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
                ServerSide::Local(l) => l.not_applicable(kind),
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
            FaultTarget::Session => match self {
                ServerSide::Local(l) => l.not_applicable(kind),
                ServerSide::Pids(_) => Some(
                    "ends sessions as the superuser of a server the run started, or takes lock files away: only with `--local postgres`, `--local mysql` or `--local file`"
                        .into(),
                ),
            },
        }
    }
}

/// Why worker connections cannot go through fault proxies for `url`, if they cannot.
pub fn proxy_not_applicable(url: &ServiceUrl) -> Option<String> {
    if url.scheme == "file" {
        return Some(
            "the file backend's locks are the kernel's, on this host: there is no connection to cut".into(),
        );
    }
    if url.scheme == "redis+cluster" {
        return Some(
            "a Redis Cluster client connects to the node addresses the cluster announces (CLUSTER SLOTS), not to the ones in the URL, so a proxy per worker would not be on its path".into(),
        );
    }
    if url.scheme.ends_with("+sentinel") {
        return Some(
            "a Sentinel client asks the sentinels in the URL for the master, then connects to the address they announce, so a proxy per worker would be on the path to the sentinels only, not to the data".into(),
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
