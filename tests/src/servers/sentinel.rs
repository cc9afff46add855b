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
mod node;
mod options;
mod state;

pub use node::SentinelNode;
use node::{info_field, is_healthy};
pub use options::{percent_encode, SentinelOptions};

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
        let mut target = None;
        group.wait_for("replicating", SENTINEL_READY_LIMIT, |g| {
            g.replication_state(0, replicas, &mut target)
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
        let mut target = None;
        self.wait_for("reconfigured as a replica", RESTART_AS_REPLICA_LIMIT, |g| {
            g.synced_state(master, &mut target)?;
            g.sentinels_see_replica(&name, replica_addr)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::node::parse_entries;
    use super::options::conf_quote;
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
