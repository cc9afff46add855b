//! Whether the server may evict a held lock's key to make room: read from
//! `INFO memory` at connect (the server, each Cluster master, the Sentinel
//! master found at connect, each Redlock master), refused unless the URL
//! accepts it (`?eviction=accept`). Not yet read again after a reconnect or
//! a Sentinel failover: a master reconfigured later is not refused.
//!
//! Why: a server with `maxmemory` set and an evicting `maxmemory-policy`
//! (`allkeys-lru`, or `volatile-lru`, managed Redis's usual default, which
//! evicts keys with a ttl: every lock key has one) drops a held lock's key
//! when memory runs short, and the next client is granted the lock while
//! its holder still believes it holds it. `INFO` is read rather than
//! `CONFIG GET`, which managed services often rename away. A server that
//! refuses `INFO` too is not refused: that is logged once, as a warning.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::aio::ConnectionLike;
use redis::Value;

use crate::backends::redis::topology::server::Server;
use crate::backends::redis::{Conn, RedisBackend};
use crate::LockError;

/// Which connections' servers were read: the count of
/// [`Reconnects`](crate::backends::redis::transport::connection::Reconnects)
/// when the last check passed, and when the last refusal was told (each
/// plus one: 0 is "never").
#[derive(Debug, Default)]
pub(crate) struct Checked {
    passed: AtomicU64,
    refused: AtomicU64,
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
        }
        answer
    }

    /// Whether no connection was opened or broken since the last check
    /// passed: one atomic read per grant, the whole cost while nothing
    /// changes.
    pub(in crate::backends::redis) fn eviction_current(&self) -> bool {
        self.eviction.passed.load(Ordering::Acquire) == self.reconnects.now() + 1
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
/// every master) each master's.
fn texts(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => into.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => into.push(text.clone()),
        Value::Array(values) | Value::Set(values) => values.iter().for_each(|v| texts(v, into)),
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| texts(v, into)),
        _ => {}
    }
}

/// The eviction settings the `INFO memory` answer `value` reports, one per
/// server that answered; empty if none reported them.
pub(crate) fn from_info(value: &Value) -> Vec<Eviction> {
    let mut found = Vec::new();
    texts(value, &mut found);
    found.iter().filter_map(|t| Eviction::parse(t)).collect()
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
    match from_info(&value).into_iter().find(Eviction::evicts) {
        Some(evicting) => Err(evicting.refusal(server)),
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
    }

    #[test]
    fn hidden_fields_are_none() {
        assert_eq!(Eviction::parse("# Memory\r\nused_memory:1\r\n"), None);
    }
}
