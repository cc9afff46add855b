//! Redis Sentinel for the tests: one master, N replicas and three sentinels, all on free
//! loopback ports with temp dirs, stopped on drop.
//!
//! The data nodes are [`RedisServer`]s (so [`ServerControl`] kills, pauses and restarts them);
//! the replicas start with `--replicaof` the master. Each sentinel is `redis-server <conf>
//! --sentinel` with its own writable `sentinel.conf` in its own temp dir (a sentinel rewrites
//! its file), monitoring the master under [`SentinelOptions::master_name`] (`mm`) with quorum
//! 2. Every data node runs with `--repl-diskless-sync-delay 0`: Redis 7.0 otherwise waits
//! 5 s for more replicas before each full sync (at start, and for a node that rejoins).
//!
//! [`RedisSentinel::start`] returns only once the group is ready for a failover: every
//! replica reports `master_link_status:up`, the master `connected_slaves:N`, and every
//! sentinel names the master, knows the other two sentinels and the N replicas (sentinels
//! find each other through hello messages). Every wait is bounded, and its error quotes the
//! end of every log.
//!
//! With [`SentinelOptions::tls`], every node and sentinel is TLS-only on one throwaway CA,
//! and [`RedisSentinel::url`] is a `rediss+sentinel://…?ca=` URL.
//!
//! The sentinels run with shorter periods than Redis' own, set with `SENTINEL DEBUG` (see
//! [`SentinelOptions::tilt_period`]): a 3 s TILT instead of 30 s, `INFO` every 1 s, hello
//! every 0.5 s. The protocol a client sees is unchanged; failovers and reconfigurations
//! just come sooner and within a test's time.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_tests::servers::RedisSentinel;
//!
//! let mut group = RedisSentinel::start(1);
//! let url = group.url(); // redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/mm
//! group.redis_cli_master(&["SET", "k", "v"]);
//! let old = group.master_addr();
//! let killed = group.kill_master();
//! let new = group.wait_failover(old, Duration::from_secs(15)).unwrap();
//! assert_ne!(new, killed);
//! group.restart_as_replica(killed).unwrap();
//! # drop(url);
//! ```

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::error::{Context, HarnessError, HarnessResult};
use crate::servers::accessors::{member_accessors, single_server_accessors};
use crate::servers::control::ServerControl;
use crate::servers::ports::{free_port, retry_port_clash};
use crate::servers::process::{
    log_tail, require_binary, run_command, CommandOutput, ProcessSpec, ServerProcess,
    PROBE_INTERVAL,
};
use crate::servers::redis::{redis_cli_args, RedisOptions, RedisServer, REDIS_PACKAGES};
use crate::tls::TestCerts;

/// The master name the sentinels monitor unless [`SentinelOptions::master_name`] says another.
pub const DEFAULT_MASTER_NAME: &str = "mm";
/// Upper bound for the group to become ready (and for [`RedisSentinel::wait_replicas_synced`]
/// callers who have no better bound).
pub const SENTINEL_READY_LIMIT: Duration = Duration::from_secs(20);
/// Upper bound for [`RedisSentinel::restart_as_replica`]: a sentinel converts a returning
/// old master at its first `INFO` after the node has reported itself master for 4 publish
/// periods: 2-3 s with the harness's periods, 8-20 s with Redis' own (2 s, `INFO` every
/// 10 s).
pub const RESTART_AS_REPLICA_LIMIT: Duration = Duration::from_secs(30);
/// Upper bound for one `redis-cli` run.
const CLI_LIMIT: Duration = Duration::from_secs(10);
/// Upper bound for one probe (a paused process must not stall a wait).
const PROBE_LIMIT: Duration = Duration::from_secs(2);
/// Log lines of each process quoted in a group's error messages.
const GROUP_LOG_LINES: usize = 15;
/// Sentinels in the group (a quorum of 2 needs 3 to survive the loss of one).
const SENTINELS: usize = 3;
/// The sentinels' quorum for objective down.
const QUORUM: usize = 2;

/// How to start a [`RedisSentinel`]: master name, timings, authentication, persistence.
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    master_name: String,
    down_after: Duration,
    failover_timeout: Duration,
    /// What every data node starts with: the password of its `default`
    /// user, its ACL user, TLS (see [`SentinelOptions::node_options`]).
    nodes: RedisOptions,
    sentinel_password: Option<String>,
    appendonly: bool,
    periods: Vec<(&'static str, Duration)>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        Self {
            master_name: DEFAULT_MASTER_NAME.to_string(),
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(4000),
            nodes: RedisOptions::new(),
            sentinel_password: None,
            appendonly: false,
            periods: vec![
                ("tilt-period", Duration::from_secs(3)),
                ("info-period", Duration::from_secs(1)),
                ("publish-period", Duration::from_millis(500)),
            ],
        }
    }
}

impl SentinelOptions {
    /// Master `mm`, `down-after-milliseconds` 1000, `failover-timeout` 4000, no
    /// authentication, no persistence, and the shorter sentinel periods of
    /// [`SentinelOptions::tilt_period`], [`SentinelOptions::info_period`] and
    /// [`SentinelOptions::publish_period`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The name the sentinels know the master by (`sentinel monitor NAME ...`).
    pub fn master_name(mut self, name: impl Into<String>) -> Self {
        self.master_name = name.into();
        self
    }

    /// `sentinel down-after-milliseconds`: how long a node may stay silent before a
    /// sentinel calls it subjectively down (default 1 s).
    pub fn down_after(mut self, down_after: Duration) -> Self {
        self.down_after = down_after;
        self
    }

    /// `sentinel failover-timeout` (default 4 s).
    pub fn failover_timeout(mut self, timeout: Duration) -> Self {
        self.failover_timeout = timeout;
        self
    }

    /// Password of the `default` user on every data node (`--requirepass`); the replicas
    /// get `--masterauth` and the sentinels `sentinel auth-pass`.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.nodes = self.nodes.password(password);
        self
    }

    /// An ACL user with every permission on every data node; the replicas replicate as it
    /// (`--masteruser`/`--masterauth`) and the sentinels log in as it (`sentinel auth-user`
    /// / `auth-pass`). Combine with [`SentinelOptions::password`] to lock out the `default`
    /// user.
    pub fn acl_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.nodes = self.nodes.acl_user(name, password);
        self
    }

    /// A password on the sentinels themselves (`requirepass` in each sentinel's conf): a
    /// client must `AUTH` before asking a sentinel anything.
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(password.into());
        self
    }

    /// `--appendonly yes` on every data node (an old master restarted after `kill -9`
    /// reloads what it had acknowledged).
    pub fn appendonly(mut self, appendonly: bool) -> Self {
        self.appendonly = appendonly;
        self
    }

    /// TLS only, everywhere, with one throwaway CA ([`TestCerts`]) for the whole group:
    /// the data nodes run `--port 0 --tls-port P` with `--tls-replication yes` (replicas
    /// replicate over TLS) and `--tls-auth-clients no`, like [`RedisOptions::tls`]; the
    /// sentinels run `port 0`, `tls-port S`, the same certificate, key and CA,
    /// `tls-replication yes` and `tls-auth-clients no`.
    ///
    /// What Redis 7.0 needs for this: a sentinel speaks TLS to the master, the replicas and
    /// the other sentinels only with `tls-replication yes` (without it, it connects in
    /// plain text and the TLS-only nodes drop it: `Error accepting a client connection:
    /// ... SSL routines::wrong version number` in the master's log, and the sentinel calls
    /// the master `s_down,master,disconnected`; checked by hand with 7.0.15). With
    /// it, a sentinel announces its `tls-port` in its hello messages, and a replica
    /// announces its `tls-port` to its master (`REPLCONF listening-port`), so the
    /// addresses the sentinels learn and hand out are the TLS ports. As a TLS client, a
    /// sentinel or replica presents `tls-cert-file` (the test server certificate is also
    /// a client certificate), which nobody asks for here anyway (`tls-auth-clients no`).
    ///
    /// [`RedisSentinel::url`] is then `rediss+sentinel://…/NAME?ca=<ca.crt>`, and the
    /// harness's own `redis-cli` calls use `--tls --cacert <ca.crt>`.
    pub fn tls(mut self, tls: bool) -> Self {
        self.nodes = self.nodes.tls(tls);
        self
    }

    /// How long a sentinel stays in TILT mode, where it starts no failover (Redis: 30 s;
    /// here 3 s). A sentinel enters TILT when its 100 ms timer runs more than 2 s late: on
    /// this shared 2-core machine, under parallel builds, all three sentinels did so at
    /// once (a stalled machine, a slow `fsync` of the rewritten conf), and a failover then
    /// waited the whole period. Set with `SENTINEL DEBUG tilt-period` once each sentinel
    /// answers (again after a restart).
    pub fn tilt_period(self, period: Duration) -> Self {
        self.period("tilt-period", period)
    }

    /// How often a sentinel sends `INFO` to the nodes when no failover is under way
    /// (Redis: 10 s; here 1 s): a returning old master is turned into a replica at the
    /// first `INFO` after it has reported itself master for 4 publish periods, and a
    /// sentinel learns new replicas from it. `SENTINEL DEBUG info-period`.
    pub fn info_period(self, period: Duration) -> Self {
        self.period("info-period", period)
    }

    /// How often a sentinel publishes its hello message (Redis: 2 s; here 0.5 s): the
    /// sentinels find each other through them. `SENTINEL DEBUG publish-period`.
    pub fn publish_period(self, period: Duration) -> Self {
        self.period("publish-period", period)
    }

    fn period(mut self, name: &'static str, period: Duration) -> Self {
        self.periods.retain(|(n, _)| *n != name);
        self.periods.push((name, period));
        self
    }

    /// The `SENTINEL DEBUG` arguments that set the periods.
    fn debug_args(&self) -> Vec<String> {
        let mut args = vec!["SENTINEL".to_string(), "DEBUG".to_string()];
        for (name, period) in &self.periods {
            args.push((*name).to_string());
            args.push(period.as_millis().to_string());
        }
        args
    }

    /// The options of one data node; a replica of the node on `replica_of`.
    fn node_options(&self, replica_of: Option<u16>) -> RedisOptions {
        let nodes = &self.nodes;
        let mut options = nodes.clone().config(["--repl-diskless-sync-delay", "0"]);
        if self.tls_certs().is_some() {
            options = options.config(["--tls-replication", "yes"]);
        }
        if let Some(password) = &nodes.password {
            options = options.config(["--masterauth", password]);
        }
        // After `--masterauth` of the default user, so that these win.
        if let Some((user, password)) = &nodes.acl_user {
            options = options.config(["--masteruser", user, "--masterauth", password]);
        }
        if self.appendonly {
            options = options.config(["--appendonly", "yes"]);
        }
        if let Some(port) = replica_of {
            options = options.config([
                "--replicaof".to_string(),
                "127.0.0.1".into(),
                port.to_string(),
            ]);
        }
        options
    }

    /// The group's certificates, if it runs TLS (set by [`RedisSentinel::try_start_with`]).
    fn tls_certs(&self) -> Option<&TestCerts> {
        self.nodes.certs.as_ref().filter(|_| self.nodes.tls)
    }

    /// The `sentinel.conf` of a sentinel on `port` with its dir `dir`.
    fn sentinel_conf(&self, port: u16, dir: &std::path::Path, master_port: u16) -> String {
        let name = conf_quote(&self.master_name);
        let listen = match self.tls_certs() {
            // See [`SentinelOptions::tls`] for why `tls-replication yes`.
            Some(certs) => format!(
                "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-replication yes\ntls-auth-clients no",
                conf_quote(&certs.server_cert_path().display().to_string()),
                conf_quote(&certs.server_key_path().display().to_string()),
                conf_quote(&certs.ca_cert_path().display().to_string()),
            ),
            None => format!("port {port}"),
        };
        let mut conf = format!(
            "{listen}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor {name} 127.0.0.1 {master_port} {QUORUM}\n\
             sentinel down-after-milliseconds {name} {}\n\
             sentinel failover-timeout {name} {}\n\
             sentinel parallel-syncs {name} 1\n",
            conf_quote(&dir.display().to_string()),
            self.down_after.as_millis(),
            self.failover_timeout.as_millis(),
        );
        match (&self.nodes.acl_user, &self.nodes.password) {
            (Some((user, password)), _) => {
                let _ = writeln!(conf, "sentinel auth-user {name} {}", conf_quote(user));
                let _ = writeln!(conf, "sentinel auth-pass {name} {}", conf_quote(password));
            }
            (None, Some(password)) => {
                let _ = writeln!(conf, "sentinel auth-pass {name} {}", conf_quote(password));
            }
            (None, None) => {}
        }
        if let Some(password) = &self.sentinel_password {
            // The sentinels also log in to each other with it.
            let _ = writeln!(conf, "requirepass {}", conf_quote(password));
        }
        conf
    }
}

/// A word of a Redis config file, double-quoted with `"` and `\` escaped.
fn conf_quote(word: &str) -> String {
    let mut quoted = String::with_capacity(word.len() + 2);
    quoted.push('"');
    for c in word.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// `text` percent-encoded for a URL's user info or path: everything but RFC 3986's
/// unreserved characters (`A-Z a-z 0-9 - . _ ~`) becomes `%XX`.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// One sentinel process (`redis-server sentinel.conf --sentinel`), stopped on drop.
#[derive(Debug)]
pub struct SentinelNode {
    // Field order matters: the process must stop before the temp dir is removed.
    process: ServerProcess,
    port: u16,
    password: Option<String>,
    /// The CA to trust with `redis-cli --tls`, for a TLS sentinel.
    ca: Option<PathBuf>,
    debug_args: Vec<String>,
    cli: PathBuf,
    dir: TempDir,
}

impl SentinelNode {
    fn try_start(options: &SentinelOptions, master_port: u16) -> HarnessResult<Self> {
        let server = require_binary("redis-server", REDIS_PACKAGES)?;
        let cli = require_binary("redis-cli", REDIS_PACKAGES)?;
        retry_port_clash(|| {
            let port = free_port()?;
            let dir = tempfile::Builder::new()
                .prefix(&format!("dlock-sentinel-{port}-"))
                .tempdir()
                .context(|| "create temp dir for a sentinel".to_string())?;
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(&conf, options.sentinel_conf(port, dir.path(), master_port))
                .context(|| format!("write {}", conf.display()))?;
            let spec = ProcessSpec::new(
                format!("redis-sentinel 127.0.0.1:{port}"),
                &server,
                dir.path().join("sentinel.log"),
            )
            .arg(&conf)
            .arg("--sentinel");
            let mut node = Self {
                process: ServerProcess::spawn(spec)?,
                port,
                password: options.sentinel_password.clone(),
                ca: options
                    .tls_certs()
                    .map(|certs| certs.ca_cert_path().to_path_buf()),
                debug_args: options.debug_args(),
                cli: cli.clone(),
                dir,
            };
            node.wait_ready()?;
            Ok(node)
        })
    }

    single_server_accessors!(port);

    /// The sentinel's config file (the sentinel rewrites it with what it learns).
    pub fn conf_path(&self) -> PathBuf {
        self.dir.path().join("sentinel.conf")
    }

    /// Runs one command with `redis-cli` against this sentinel (authenticated if the
    /// sentinels have a password) and returns its trimmed stdout, e.g.
    /// `["SENTINEL", "get-master-addr-by-name", "mm"]` → `"127.0.0.1\n23456"`. Panics if
    /// redis-cli cannot run, fails or takes longer than 10 s.
    #[track_caller]
    pub fn redis_cli(&self, args: &[&str]) -> String {
        CommandOutput::trimmed_stdout(
            self.try_redis_cli(args),
            format_args!("redis-cli {args:?} against sentinel {}", self.addr()),
        )
    }

    /// Fallible [`SentinelNode::redis_cli`] with the full output.
    pub fn try_redis_cli(&self, args: &[&str]) -> HarnessResult<CommandOutput> {
        self.cli_with_limit(args, CLI_LIMIT)
    }

    fn cli_with_limit(&self, args: &[&str], limit: Duration) -> HarnessResult<CommandOutput> {
        // The sentinels have no ACL users: the default one, with the password.
        let mut all = redis_cli_args(
            self.port,
            self.ca.as_deref(),
            None,
            self.password.as_deref(),
        );
        all.extend(args.iter().map(OsString::from));
        run_command(&self.cli, &all, &[], limit)
    }

    /// The trimmed answer of a probe, `None` if the sentinel did not answer in time.
    fn probe(&self, args: &[&str]) -> Option<String> {
        self.cli_with_limit(args, PROBE_LIMIT)
            .ok()
            .filter(CommandOutput::success)
            .map(|out| out.stdout.trim().to_string())
    }

    /// Whether this sentinel is running and not paused, so it can be asked.
    fn answers(&self) -> bool {
        self.process.pid().is_some() && !self.process.is_paused()
    }

    /// The master address this sentinel reports for `name`.
    fn master_addr_of(&self, name: &str) -> Option<SocketAddr> {
        let answer = self.probe(&["SENTINEL", "get-master-addr-by-name", name])?;
        let mut lines = answer.lines();
        let ip: Ipv4Addr = lines.next()?.trim().parse().ok()?;
        let port: u16 = lines.next()?.trim().parse().ok()?;
        Some(SocketAddr::from((ip, port)))
    }

    /// The entries of `SENTINEL sentinels|replicas NAME`, as field maps.
    fn entries(&self, what: &str, name: &str) -> Option<Vec<HashMap<String, String>>> {
        self.probe(&["SENTINEL", what, name])
            .map(|answer| parse_entries(&answer))
    }
}

impl ServerControl for SentinelNode {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// Waits until the sentinel answers `PING`, then sets its periods (`SENTINEL DEBUG`,
    /// which lives only as long as the process).
    fn wait_ready(&mut self) -> HarnessResult<()> {
        let (cli, mut args) = (
            self.cli.clone(),
            redis_cli_args(
                self.port,
                self.ca.as_deref(),
                None,
                self.password.as_deref(),
            ),
        );
        args.push("PING".into());
        self.process
            .wait_until("answering PING", SENTINEL_READY_LIMIT, || {
                run_command(&cli, &args, &[], PROBE_LIMIT)
                    .is_ok_and(|out| out.stdout.trim() == "PONG")
            })?;
        let debug: Vec<&str> = self.debug_args.iter().map(String::as_str).collect();
        let out = self.try_redis_cli(&debug)?;
        if out.success() && out.stdout.trim() == "OK" {
            Ok(())
        } else {
            Err(HarnessError::new(format!(
                "{} refused {debug:?}: {}{}",
                self.process.name(),
                out.stdout,
                out.stderr
            )))
        }
    }
}

/// Splits redis-cli's flat output of an array of field/value arrays (`SENTINEL sentinels`,
/// `SENTINEL replicas`) into one map per entry; each entry starts with its `name` field.
fn parse_entries(answer: &str) -> Vec<HashMap<String, String>> {
    let lines: Vec<&str> = answer.lines().map(str::trim).collect();
    let mut entries: Vec<HashMap<String, String>> = Vec::new();
    for pair in lines.chunks(2) {
        let [field, value] = pair else { break };
        if *field == "name" || entries.is_empty() {
            entries.push(HashMap::new());
        }
        if let Some(entry) = entries.last_mut() {
            entry.insert((*field).to_string(), (*value).to_string());
        }
    }
    entries
}

/// Whether an entry of `SENTINEL sentinels|replicas` is reachable and not considered down
/// (its `flags` are exactly `sentinel` or `slave`).
fn is_healthy(entry: &HashMap<String, String>, role: &str) -> bool {
    entry.get("flags").is_some_and(|flags| flags == role)
}

/// The value of `field:` in `INFO` output.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// One master, its replicas and three sentinels, stopped on drop (sentinels first).
#[derive(Debug)]
pub struct RedisSentinel {
    // Field order matters: the sentinels stop first, so they start no failover meanwhile.
    sentinels: Vec<SentinelNode>,
    nodes: Vec<RedisServer>,
    options: SentinelOptions,
    // Dropped after every process: the TLS group's certificates.
    _certs_dir: Option<TempDir>,
}

impl RedisSentinel {
    /// Starts a master, `replicas` replicas and three sentinels with the default
    /// [`SentinelOptions`], and waits until the group is ready. Panics with the harness
    /// error on failure.
    #[track_caller]
    pub fn start(replicas: usize) -> Self {
        Self::try_start_with(replicas, SentinelOptions::new()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`RedisSentinel::start`] with `options`. Node 0 is the first master.
    pub fn try_start_with(replicas: usize, mut options: SentinelOptions) -> HarnessResult<Self> {
        // One CA for every node and sentinel of a TLS group (they connect to each other).
        let certs_dir = if options.nodes.tls && options.nodes.certs.is_none() {
            let dir = tempfile::Builder::new()
                .prefix("dlock-sentinel-certs-")
                .tempdir()
                .context(|| "create temp dir for sentinel certificates".to_string())?;
            options.nodes.certs = Some(TestCerts::generate(dir.path())?);
            Some(dir)
        } else {
            None
        };
        let master = RedisServer::try_start_with(options.node_options(None))?;
        let master_port = master.port();
        let mut group = Self {
            sentinels: Vec::with_capacity(SENTINELS),
            nodes: vec![master],
            options,
            _certs_dir: certs_dir,
        };
        for _ in 0..replicas {
            let replica =
                RedisServer::try_start_with(group.options.node_options(Some(master_port)))?;
            group.nodes.push(replica);
        }
        // Sentinels started after the replicas are attached learn them from their first
        // `INFO` to the master; started earlier, they would only at the next one, 10 s later.
        group.wait_for("replicating", SENTINEL_READY_LIMIT, |g| {
            g.replication_state(0, replicas)
        })?;
        for _ in 0..SENTINELS {
            let sentinel = SentinelNode::try_start(&group.options, master_port)?;
            group.sentinels.push(sentinel);
        }
        let master_addr = group.nodes[0].addr();
        group.wait_for("ready for a failover", SENTINEL_READY_LIMIT, |g| {
            g.sentinels_state(master_addr, replicas)
        })?;
        Ok(group)
    }

    member_accessors!(nodes: RedisServer, node, node_mut, nodes);

    /// Sentinel `i` (0-based), e.g. to read its conf or ask it directly.
    pub fn sentinel(&self, i: usize) -> &SentinelNode {
        &self.sentinels[i]
    }

    /// Sentinel `i`, to kill, pause or restart it.
    pub fn sentinel_mut(&mut self, i: usize) -> &mut SentinelNode {
        &mut self.sentinels[i]
    }

    /// The three sentinels, in start order.
    pub fn sentinels(&self) -> &[SentinelNode] {
        &self.sentinels
    }

    /// The name the sentinels know the master by (`mm` by default).
    pub fn master_name(&self) -> &str {
        &self.options.master_name
    }

    /// The sentinels' addresses, in start order.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(SentinelNode::addr).collect()
    }

    /// The password of the sentinels themselves, if they have one.
    pub fn sentinel_password(&self) -> Option<&str> {
        self.options.sentinel_password.as_deref()
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/NAME`, without credentials;
    /// for a TLS group (see [`SentinelOptions::tls`])
    /// `rediss+sentinel://127.0.0.1:S1,…/NAME?ca=<ca.crt>`.
    pub fn url(&self) -> String {
        self.url_with_userinfo("")
    }

    /// The CA certificate (PEM file) of a TLS group, which every node and sentinel trusts.
    pub fn ca_cert_path(&self) -> Option<&std::path::Path> {
        self.options.tls_certs().map(TestCerts::ca_cert_path)
    }

    /// The certificates of a TLS group.
    pub fn certs(&self) -> Option<&TestCerts> {
        self.options.tls_certs()
    }

    /// The URL with every credential, percent-encoded: the data nodes' ACL user
    /// (`redis+sentinel://USER:PASS@.../NAME`), or else their `default` user's password
    /// (`redis+sentinel://:PASS@.../NAME`), and the sentinels' own password as the
    /// backend's `?sentinel_password=`; [`RedisSentinel::url`] when there is none.
    pub fn url_with_credentials(&self) -> String {
        let mut url = match (&self.options.nodes.acl_user, &self.options.nodes.password) {
            (Some((user, password)), _) => self.url_with_userinfo(&format!(
                "{}:{}@",
                percent_encode(user),
                percent_encode(password)
            )),
            (None, Some(password)) => {
                self.url_with_userinfo(&format!(":{}@", percent_encode(password)))
            }
            (None, None) => self.url(),
        };
        if let Some(password) = &self.options.sentinel_password {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str("sentinel_password=");
            url.push_str(&percent_encode(password));
        }
        url
    }

    fn url_with_userinfo(&self, userinfo: &str) -> String {
        let hosts: Vec<String> = self
            .sentinel_addrs()
            .iter()
            .map(SocketAddr::to_string)
            .collect();
        let url = format!(
            "{}://{userinfo}{}/{}",
            if self.options.nodes.tls {
                "rediss+sentinel"
            } else {
                "redis+sentinel"
            },
            hosts.join(","),
            percent_encode(&self.options.master_name)
        );
        match self.ca_cert_path() {
            // dlock takes `ca` as written (no percent-decoding); temp paths need none.
            Some(ca) => format!("{url}?ca={}", ca.display()),
            None => url,
        }
    }

    /// The master's address as the first running, unpaused sentinel that answers reports
    /// it. Panics if none does.
    #[track_caller]
    pub fn master_addr(&self) -> SocketAddr {
        self.try_master_addr().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`RedisSentinel::master_addr`].
    pub fn try_master_addr(&self) -> HarnessResult<SocketAddr> {
        self.sentinels
            .iter()
            .filter(|s| s.answers())
            .find_map(|s| s.master_addr_of(&self.options.master_name))
            .ok_or_else(|| {
                HarnessError::new(format!(
                    "no sentinel named the master {}; logs:\n{}",
                    self.options.master_name,
                    self.logs()
                ))
            })
    }

    /// Which node is the master now, by asking a sentinel. Panics if no sentinel answers or
    /// the address is not one of the nodes.
    #[track_caller]
    pub fn master_index(&self) -> usize {
        self.try_master_index().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`RedisSentinel::master_index`].
    pub fn try_master_index(&self) -> HarnessResult<usize> {
        let addr = self.try_master_addr()?;
        self.index_of(addr).ok_or_else(|| {
            HarnessError::new(format!("the sentinels name {addr}, which is no node here"))
        })
    }

    fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr() == addr)
    }

    /// Every node but the current master (killed ones included), in order.
    #[track_caller]
    pub fn replica_indices(&self) -> Vec<usize> {
        let master = self.master_index();
        (0..self.nodes.len()).filter(|&i| i != master).collect()
    }

    /// Runs one command with `redis-cli` on the current master (authenticated) and returns
    /// its trimmed stdout; panics like [`RedisServer::redis_cli`].
    #[track_caller]
    pub fn redis_cli_master(&self, args: &[&str]) -> String {
        self.nodes[self.master_index()].redis_cli(args)
    }

    /// Runs one command with `redis-cli` on sentinel `i`; panics like
    /// [`SentinelNode::redis_cli`].
    #[track_caller]
    pub fn sentinel_cli(&self, i: usize, args: &[&str]) -> String {
        self.sentinels[i].redis_cli(args)
    }

    /// Kills the current master with SIGKILL and returns its index.
    #[track_caller]
    pub fn kill_master(&mut self) -> usize {
        let master = self.master_index();
        self.nodes[master].kill9();
        master
    }

    /// Freezes node `i` with SIGSTOP (see [`ServerControl::pause`]).
    #[track_caller]
    pub fn pause(&mut self, i: usize) {
        self.nodes[i].pause();
    }

    /// Lets node `i` go on with SIGCONT.
    #[track_caller]
    pub fn resume(&mut self, i: usize) {
        self.nodes[i].resume();
    }

    /// Waits until every running, unpaused sentinel names the same master, other than
    /// `old_master`, and that node's `ROLE` says `master`; returns its index. The error
    /// after `limit` says what each sentinel reported and quotes the logs.
    pub fn wait_failover(
        &mut self,
        old_master: SocketAddr,
        limit: Duration,
    ) -> HarnessResult<usize> {
        let name = self.options.master_name.clone();
        let mut found = None;
        self.wait_for("failed over", limit, |g| {
            let reports: Vec<Option<SocketAddr>> = g
                .sentinels
                .iter()
                .filter(|s| s.answers())
                .map(|s| s.master_addr_of(&name))
                .collect();
            let agreed = match reports.first() {
                Some(Some(addr)) if reports.iter().all(|r| *r == Some(*addr)) => *addr,
                _ => return Err(format!("the sentinels report {reports:?}")),
            };
            if agreed == old_master {
                return Err(format!("the sentinels still name {old_master}"));
            }
            let index = g
                .index_of(agreed)
                .ok_or_else(|| format!("the sentinels name {agreed}, which is no node here"))?;
            let role = g.nodes[index]
                .cli_with_limit(&["ROLE"], PROBE_LIMIT)
                .map(|out| out.stdout)
                .unwrap_or_default();
            if role.lines().next().map(str::trim) != Some("master") {
                return Err(format!("{agreed} is named, but its ROLE is {role:?}"));
            }
            found = Some(index);
            Ok(())
        })?;
        found.ok_or_else(|| HarnessError::new("failover found no master"))
    }

    /// Starts node `index` again (after a kill: the old master, say) with its old command
    /// line and waits until it replicates from the current master (as
    /// [`RedisSentinel::wait_replicas_synced`], so every other running, unpaused replica
    /// too) and every running sentinel lists it as a healthy replica.
    ///
    /// The sentinels reconfigure it (`+convert-to-slave`), not the harness: until then it
    /// serves as a master of its own for a few seconds (see [`RESTART_AS_REPLICA_LIMIT`]),
    /// which is what a client that reaches it meanwhile sees.
    pub fn restart_as_replica(&mut self, index: usize) -> HarnessResult<()> {
        let master = self.try_master_index()?;
        if master == index {
            return Err(HarnessError::new(format!(
                "node {index} is still the master: wait for the failover first"
            )));
        }
        self.nodes[index].process_mut().start()?;
        self.nodes[index].wait_ready()?;
        let replica_addr = self.nodes[index].addr();
        let name = self.options.master_name.clone();
        self.wait_for("reconfigured as a replica", RESTART_AS_REPLICA_LIMIT, |g| {
            g.synced_state(master)?;
            g.sentinels_see_replica(&name, replica_addr)
        })
    }

    /// Waits until every running, unpaused node but the master replicates from it
    /// (`master_link_status:up`) and has acknowledged everything written so far (`WAIT` on
    /// the master).
    ///
    /// The acknowledgement matters: after a full sync, Redis 7.0 streams nothing to a
    /// replica until its first `REPLCONF ACK` (sent every second), though both sides
    /// already report the link up; a replica paused in that window never gets the writes
    /// made meanwhile.
    pub fn wait_replicas_synced(&mut self, limit: Duration) -> HarnessResult<()> {
        let master = self.try_master_index()?;
        self.wait_for("replicas synced", limit, |g| g.synced_state(master))
    }

    /// Ok once every running, unpaused node but `master` replicates from it with the link
    /// up, and `WAIT` on the master counts them all.
    fn synced_state(&self, master: usize) -> Result<(), String> {
        let master_port = self.nodes[master].port().to_string();
        let mut count = 0;
        for (i, node) in self.nodes.iter().enumerate() {
            if i == master || node.pid().is_none() || node.process().is_paused() {
                continue;
            }
            let info = self.info_replication(i)?;
            if info_field(&info, "master_port") != Some(&master_port)
                || info_field(&info, "master_link_status") != Some("up")
            {
                return Err(format!("node {i} ({}) reports:\n{info}", node.addr()));
            }
            count += 1;
        }
        if count == 0 {
            return Ok(());
        }
        let acked = self.nodes[master]
            .cli_with_limit(&["WAIT", &count.to_string(), "500"], PROBE_LIMIT)
            .map(|out| out.stdout.trim().to_string())
            .unwrap_or_default();
        if acked.parse::<usize>().is_ok_and(|n| n >= count) {
            Ok(())
        } else {
            Err(format!("WAIT {count} on the master answered {acked:?}"))
        }
    }

    /// `INFO replication` of node `i`, or why not.
    fn info_replication(&self, i: usize) -> Result<String, String> {
        let out = self.nodes[i]
            .cli_with_limit(&["INFO", "replication"], PROBE_LIMIT)
            .map_err(|e| e.to_string())?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(format!(
                "node {i} ({}): {}{}",
                self.nodes[i].addr(),
                out.stdout,
                out.stderr
            ))
        }
    }

    /// Ok once `replicas` replicas report their link to node `master` up, it reports
    /// `connected_slaves:N`, and they have acknowledged its stream.
    fn replication_state(&self, master: usize, replicas: usize) -> Result<(), String> {
        for i in (0..self.nodes.len()).filter(|&i| i != master) {
            let info = self.info_replication(i)?;
            if info_field(&info, "master_link_status") != Some("up") {
                return Err(format!(
                    "replica {i} ({}) reports:\n{info}",
                    self.nodes[i].addr()
                ));
            }
        }
        let info = self.info_replication(master)?;
        if info_field(&info, "connected_slaves") != Some(&replicas.to_string()) {
            return Err(format!("the master reports:\n{info}"));
        }
        self.synced_state(master)
    }

    /// Ok once every sentinel names `master`, knows the other sentinels and `replicas`
    /// replicas, all healthy.
    fn sentinels_state(&self, master: SocketAddr, replicas: usize) -> Result<(), String> {
        let name = &self.options.master_name;
        for s in &self.sentinels {
            let named = s.master_addr_of(name);
            if named != Some(master) {
                return Err(format!("sentinel {} names {named:?}", s.addr()));
            }
            let peers = s.entries("sentinels", name).unwrap_or_default();
            if peers.len() != SENTINELS - 1 || !peers.iter().all(|e| is_healthy(e, "sentinel")) {
                return Err(format!(
                    "sentinel {} knows the sentinels {peers:?}",
                    s.addr()
                ));
            }
            let known = s.entries("replicas", name).unwrap_or_default();
            if known.len() != replicas || !known.iter().all(|e| is_healthy(e, "slave")) {
                return Err(format!(
                    "sentinel {} knows the replicas {known:?}",
                    s.addr()
                ));
            }
        }
        Ok(())
    }

    /// Ok once every running, unpaused sentinel lists `replica` with flags `slave`.
    fn sentinels_see_replica(&self, name: &str, replica: SocketAddr) -> Result<(), String> {
        for s in self.sentinels.iter().filter(|s| s.answers()) {
            let known = s.entries("replicas", name).unwrap_or_default();
            let seen = known.iter().any(|e| {
                e.get("ip").map(String::as_str) == Some("127.0.0.1")
                    && e.get("port") == Some(&replica.port().to_string())
                    && is_healthy(e, "slave")
            });
            if !seen {
                return Err(format!(
                    "sentinel {} knows the replicas {known:?}",
                    s.addr()
                ));
            }
        }
        Ok(())
    }

    /// Probes `check` every 20 ms for at most `limit`; fails early if a started process
    /// exited, and on timeout with `check`'s last reason and every log's end.
    fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Self) -> Result<(), String>,
    ) -> HarnessResult<()> {
        let started = Instant::now();
        loop {
            if let Some(name) = self.exited() {
                return Err(HarnessError::new(format!(
                    "{name} exited while the sentinel group was getting {what}; logs:\n{}",
                    self.logs()
                )));
            }
            let reason = match check(self) {
                Ok(()) => return Ok(()),
                Err(reason) => reason,
            };
            if started.elapsed() >= limit {
                return Err(HarnessError::new(format!(
                    "sentinel group not {what} after {limit:?}: {reason}\nlogs:\n{}",
                    self.logs()
                )));
            }
            std::thread::sleep(PROBE_INTERVAL);
        }
    }

    /// The name of a process that was started (and not stopped by the harness) but exited.
    fn exited(&mut self) -> Option<String> {
        let nodes = self.nodes.iter_mut().map(|n| n.process_mut());
        let sentinels = self.sentinels.iter_mut().map(|s| s.process_mut());
        nodes
            .chain(sentinels)
            .find_map(|p| (p.pid().is_some() && !p.is_running()).then(|| p.name().to_string()))
    }

    /// The end of every process's log, for error messages.
    fn logs(&self) -> String {
        let nodes = self.nodes.iter().map(|n| n.process());
        let sentinels = self.sentinels.iter().map(|s| s.process());
        nodes
            .chain(sentinels)
            .map(|p| {
                format!(
                    "--- {} ({}):\n{}",
                    p.name(),
                    p.log_path().display(),
                    log_tail(p.log_path(), GROUP_LOG_LINES)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encodes_all_but_unreserved() {
        assert_eq!(percent_encode("a-Z_0.~"), "a-Z_0.~");
        assert_eq!(percent_encode("p@ss:w/rd?#%"), "p%40ss%3Aw%2Frd%3F%23%25");
        assert_eq!(percent_encode("é "), "%C3%A9%20");
    }

    #[test]
    fn conf_words_are_quoted() {
        assert_eq!(conf_quote(r#"a "b" \c"#), r#""a \"b\" \\c""#);
    }

    #[test]
    fn entries_split_on_name() {
        let answer = "name\nA\nip\n127.0.0.1\nflags\nsentinel\nname\nB\nflags\ns_down,sentinel";
        let entries = parse_entries(answer);
        assert_eq!(entries.len(), 2);
        assert!(is_healthy(&entries[0], "sentinel"));
        assert!(!is_healthy(&entries[1], "sentinel"));
        assert!(parse_entries("").is_empty());
    }
}
