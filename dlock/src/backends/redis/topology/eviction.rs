//! Whether the server may evict a held lock's key to make room: read from
//! `INFO memory` at connect (the server, each Cluster master, the Sentinel
//! master, each Redlock master), refused unless the URL accepts it
//! (`?eviction=accept`), and read again whenever the backend may reach
//! another server process:
//!
//! - When: `Reconnects` (`connection.rs`) counts the connections opened in
//!   place of others or to a new Sentinel master and the requests that found
//!   theirs broken (after which `redis`'s `ConnectionManager` reconnects,
//!   perhaps to a server restarted with other settings); on RESP3, the
//!   manager's own disconnect notice too. The client has no reconnect hook,
//!   and asking the server who it is (`INFO server`'s `run_id`) per request
//!   would cost a round trip each; this costs an atomic add per failure and
//!   an atomic read per grant. A Cluster's client follows a failover inside
//!   itself, unseen, so its masters are also read again after
//!   [`CLUSTER_REREAD`].
//! - Where: before every grant (`replicated.rs`, Redisson's layout, a
//!   Redlock master's vote in `for_redlock.rs`) when the count moved since
//!   the last pass; a grant answered on a connection opened meanwhile (a
//!   request resent after its connection broke) is read before it is
//!   handed over, and given back if refused. At a renewal round too, so
//!   holders hear of it when no one acquires.
//! - What then: the acquire fails with the same refusal, naming the server
//!   (the master behind Sentinel or on a Cluster); every grant reads again
//!   while it is refused, so a server set back to `noeviction` serves the
//!   next one. Held leases are kept: every dlock client that does not accept
//!   eviction is refused those keys on that server, so the holder still
//!   holds them against those; declaring them lost would stop every holder
//!   on a setting that evicts nothing until memory runs short. But a key
//!   may be gone already, so the loss alarm rings (every lease renewed at
//!   once: a missing key is heard as lost) and an error is logged, once
//!   per change. A Redlock master refused does not vote; the others'
//!   quorum decides.
//!
//! Tests: `tests/tests/redis_loss.rs`, `redis_sentinel.rs`,
//! `redis_cluster_replicas.rs`, `redlock_faults.rs`.
//!
//! Why: a server with `maxmemory` set and an evicting `maxmemory-policy`
//! (`allkeys-lru`, or `volatile-lru`, managed Redis's usual default, which
//! evicts keys with a ttl: every lock key has one) drops a held lock's key
//! when memory runs short, and the next client is granted the lock while
//! its holder still believes it holds it. `INFO` is read rather than
//! `CONFIG GET`, which managed services often rename away. A server that
//! refuses `INFO` too is not refused: that is logged once, as a warning.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::Value;

use crate::backends::redis::topology::server::Server;
use crate::backends::redis::{Conn, RedisBackend};
use crate::LockError;

/// How long a Cluster's masters are trusted after they were read: the
/// cluster client follows a failover inside itself (a `MOVED` answer, a
/// new slot map) and tells no one, so a promoted replica is not seen as a
/// new connection; the masters are read again at the first grant (or
/// renewal round) after this long. One `INFO memory` to each master, at
/// most once per this time, not per request.
pub(crate) const CLUSTER_REREAD: Duration = Duration::from_secs(10);

/// Which connections' servers were read: the count of
/// [`Reconnects`](crate::backends::redis::transport::connection::Reconnects)
/// when the last check passed, and when the last refusal was told (each
/// plus one: 0 is "never"); when the last check passed (milliseconds
/// since `since`), for a Cluster's.
#[derive(Debug)]
pub(crate) struct Checked {
    passed: AtomicU64,
    refused: AtomicU64,
    since: Instant,
    passed_ms: AtomicU64,
}

impl Default for Checked {
    fn default() -> Self {
        Checked {
            passed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            since: Instant::now(),
            passed_ms: AtomicU64::new(0),
        }
    }
}

impl Checked {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RedisBackend {
    /// Refuses a server that may evict lock keys unless the URL accepts it
    /// (`?eviction=accept`): on a Cluster, every master. A pass is
    /// remembered for the connections open now.
    pub(in crate::backends::redis) async fn check_eviction(&self) -> Result<(), LockError> {
        let seen = self.reconnects.now();
        self.count();
        let server = self.server_shown();
        let accepted = self.options.eviction_accepted;
        let answer = match self.conn.clone() {
            Conn::Single(mut c) => check(&mut c, &server, accepted).await,
            Conn::Cluster(mut c) => check_cluster(&mut c, &server, accepted).await,
        };
        if answer.is_ok() {
            self.eviction.passed.fetch_max(seen + 1, Ordering::AcqRel);
            let at = self.eviction.now_ms();
            self.eviction.passed_ms.fetch_max(at, Ordering::AcqRel);
        }
        answer
    }

    /// Whether no connection was opened or broken since the last check
    /// passed (on a Cluster, also: within [`CLUSTER_REREAD`] of it): two
    /// atomic reads per grant, the whole cost while nothing changes.
    pub(in crate::backends::redis) fn eviction_current(&self) -> bool {
        let same = self.eviction.passed.load(Ordering::Acquire) == self.reconnects.now() + 1;
        same && match self.conn {
            Conn::Cluster(_) => {
                let passed = self.eviction.passed_ms.load(Ordering::Acquire);
                self.eviction.now_ms().saturating_sub(passed) < millis(CLUSTER_REREAD)
            }
            Conn::Single(_) => true,
        }
    }

    /// Before a grant is handed over: the server is read again
    /// (`INFO memory`) if a connection was opened or broken since it last
    /// was (a restart, a failover, a new Cluster connection), and a server
    /// that now may evict is refused as at connect. While it is refused,
    /// every grant reads it again, so a server set back to `noeviction`
    /// (`CONFIG SET`) serves the next one.
    pub(in crate::backends::redis) async fn eviction_unchanged(&self) -> Result<(), LockError> {
        if self.eviction_current() {
            return Ok(());
        }
        let seen = self.reconnects.now();
        let answer = self.check_eviction().await;
        if let Err(refused @ LockError::InvalidOption { .. }) = &answer {
            self.heard_evicting(seen, refused);
        }
        answer
    }

    /// At a renewal round: the same reading, at most once per new
    /// connection (a refused server is not read again by renewals until
    /// the next one), so that holders behind a failover hear of it even
    /// when no one acquires.
    pub(in crate::backends::redis) async fn eviction_after_reconnect(&self) {
        let seen = self.reconnects.now();
        if self.eviction_current() || self.eviction.refused.load(Ordering::Acquire) == seen + 1 {
            return;
        }
        // An error that is not a refusal (the server unreachable) is the
        // renewal's to report; the next round reads again.
        let _ = self.eviction_unchanged().await;
    }

    /// The server now may evict (refused with `refused`): told once per
    /// new connection. Held leases are kept: every dlock client that does
    /// not accept eviction is refused these keys on this server, so the
    /// holder still holds them against those; but a key evicted already is
    /// gone, so the loss alarm is rung (the watchdog renews every lease at
    /// once and a missing key is heard as lost), and with keyspace
    /// notifications an eviction later is heard when it happens.
    fn heard_evicting(&self, seen: u64, refused: &LockError) {
        if self.eviction.refused.swap(seen + 1, Ordering::AcqRel) == seen + 1 {
            return;
        }
        tracing::error!(backend = %self.options.shown, error = %refused,
            "dlock: after a reconnect or failover the Redis server may evict lock keys; new grants are refused, held leases are renewed at once");
        self.subscriber.ring_loss_alarm();
    }

    /// The URL as shown and, behind Sentinel, the master written to now.
    fn server_shown(&self) -> String {
        match &self.conn {
            Conn::Single(Server::Followed(sentinel)) => {
                format!("{} (master {})", self.options.shown, sentinel.master_addr())
            }
            _ => self.options.shown.clone(),
        }
    }
}

/// What a server's `INFO memory` says about eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Eviction {
    /// `maxmemory` in bytes (`0`: no limit, nothing is evicted).
    pub(crate) maxmemory: u64,
    /// `maxmemory_policy` (`noeviction`, `allkeys-lru`, `volatile-lru`, …).
    pub(crate) policy: String,
}

impl Eviction {
    /// Reads the two fields from `INFO memory`'s text; `None` if either is
    /// missing (a server or proxy that hides them).
    pub(crate) fn parse(info: &str) -> Option<Eviction> {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        Some(Eviction {
            maxmemory: field("maxmemory")?.parse().ok()?,
            policy: field("maxmemory_policy")?.to_owned(),
        })
    }

    /// Whether this server may evict a held lock's key.
    pub(crate) fn evicts(&self) -> bool {
        self.maxmemory > 0 && self.policy != "noeviction"
    }

    /// The refusal of a server that evicts, naming `server` (the URL,
    /// password redacted), the policy found, the risk and the fixes.
    pub(crate) fn refusal(&self, server: &str) -> LockError {
        LockError::invalid_option(format!(
            "`{server}`: the server may evict lock keys: maxmemory-policy is `{policy}` with \
             maxmemory {max} bytes, so when memory runs short it can delete a held lock's key \
             and grant the lock to a second holder while the first still holds it. Set \
             `maxmemory-policy noeviction` on the server (writes then fail instead of evicting), \
             or, if you accept the risk, add `?eviction=accept` to the URL (then turn on \
             `notify-keyspace-events KEA` so holders hear an eviction at once)",
            policy = self.policy,
            max = self.maxmemory,
        ))
    }
}

/// Every text in an `INFO` answer: one server's, or (a Cluster's, sent to
/// every master) each master's, with the master's address (`at`).
fn texts(value: &Value, at: Option<&str>, into: &mut Vec<(Option<String>, String)>) {
    let at_owned = || at.map(str::to_owned);
    match value {
        Value::BulkString(bytes) => {
            into.push((at_owned(), String::from_utf8_lossy(bytes).into_owned()));
        }
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => {
            into.push((at_owned(), text.clone()));
        }
        Value::Array(values) | Value::Set(values) => {
            values.iter().for_each(|v| texts(v, at, into));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(node, v)| {
            let node = match node {
                Value::SimpleString(s) => Some(s.clone()),
                Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            };
            texts(v, node.as_deref().or(at), into);
        }),
        _ => {}
    }
}

/// The eviction settings the `INFO memory` answer `value` reports, one per
/// server that answered (with its address on a Cluster); empty if none
/// reported them.
pub(crate) fn from_info_at(value: &Value) -> Vec<(Option<String>, Eviction)> {
    let mut found = Vec::new();
    texts(value, None, &mut found);
    found
        .into_iter()
        .filter_map(|(at, t)| Some((at, Eviction::parse(&t)?)))
        .collect()
}

/// [`from_info_at`] without the addresses.
#[cfg(test)]
pub(crate) fn from_info(value: &Value) -> Vec<Eviction> {
    from_info_at(value).into_iter().map(|(_, e)| e).collect()
}

/// Set once a server refused `INFO`, so the warning is logged once.
static INFO_REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);

/// Checks the server behind `conn` (`INFO memory`): `Err` (see
/// [`Eviction::refusal`]) if it may evict and `accepted` is false. A server
/// that refuses `INFO` passes, with one warning per process.
pub(crate) async fn check<C: ConnectionLike>(
    conn: &mut C,
    server: &str,
    accepted: bool,
) -> Result<(), LockError> {
    let answer = redis::cmd("INFO")
        .arg("memory")
        .query_async::<Value>(conn)
        .await;
    check_answer(answer, server, accepted)
}

/// [`check`] on a Cluster: every master answers.
pub(crate) async fn check_cluster(
    conn: &mut crate::backends::redis::transport::cluster::ClusterConn,
    server: &str,
    accepted: bool,
) -> Result<(), LockError> {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
    let mut cmd = redis::cmd("INFO");
    cmd.arg("memory");
    let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let answer = conn.route_command(cmd, routing).await;
    check_answer(answer, server, accepted)
}

fn check_answer(
    answer: redis::RedisResult<Value>,
    server: &str,
    accepted: bool,
) -> Result<(), LockError> {
    let value = match answer {
        Ok(value) => value,
        Err(e) if e.is_io_error() || e.is_timeout() => {
            return Err(LockError::backend(server.to_owned(), e))
        }
        Err(e) => {
            if !INFO_REFUSED_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::warn!(backend = %server, error = %e,
                    "the server refused `INFO memory`: dlock cannot tell whether it may evict lock keys; make sure its maxmemory-policy is noeviction");
            }
            return Ok(());
        }
    };
    if accepted {
        return Ok(());
    }
    match from_info_at(&value).into_iter().find(|(_, e)| e.evicts()) {
        Some((Some(at), evicting)) => Err(evicting.refusal(&format!("{server} (master {at})"))),
        Some((None, evicting)) => Err(evicting.refusal(server)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Memory\r\nused_memory:1000\r\nmaxmemory:3145728\r\nmaxmemory_human:3.00M\r\nmaxmemory_policy:allkeys-lru\r\n";

    #[test]
    fn reads_maxmemory_and_the_policy() {
        let found = Eviction::parse(INFO).unwrap();
        assert_eq!(found.maxmemory, 3_145_728);
        assert_eq!(found.policy, "allkeys-lru");
        assert!(found.evicts());
    }

    #[test]
    fn no_limit_or_noeviction_evicts_nothing() {
        let unlimited = INFO.replace("maxmemory:3145728", "maxmemory:0");
        assert!(!Eviction::parse(&unlimited).unwrap().evicts());
        let noeviction = INFO.replace("allkeys-lru", "noeviction");
        assert!(!Eviction::parse(&noeviction).unwrap().evicts());
    }

    #[test]
    fn the_refusal_names_the_policy_and_the_fixes() {
        let text = Eviction::parse(&INFO.replace("allkeys-lru", "volatile-lru"))
            .unwrap()
            .refusal("redis://h:1")
            .to_string();
        for part in [
            "maxmemory-policy",
            "volatile-lru",
            "noeviction",
            "eviction=accept",
            "second holder",
        ] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
    }

    #[test]
    fn a_cluster_answer_is_read_per_master() {
        let answer = Value::Map(vec![
            (
                Value::SimpleString("a:1".into()),
                Value::BulkString(INFO.replace("allkeys-lru", "noeviction").into_bytes()),
            ),
            (
                Value::SimpleString("b:2".into()),
                Value::BulkString(INFO.as_bytes().to_vec()),
            ),
        ]);
        let found = from_info(&answer);
        assert_eq!(found.len(), 2);
        assert!(found.iter().any(Eviction::evicts));
        let at = from_info_at(&answer);
        assert!(at
            .iter()
            .any(|(at, e)| at.as_deref() == Some("b:2") && e.evicts()));
    }

    #[test]
    fn hidden_fields_are_none() {
        assert_eq!(Eviction::parse("# Memory\r\nused_memory:1\r\n"), None);
    }
}
