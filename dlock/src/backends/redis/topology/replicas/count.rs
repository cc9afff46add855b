//! How many replicas `?replicas=auto` asks to acknowledge a write: the
//! replicas of the master that holds the key, read from the master (and,
//! behind Sentinel, from the sentinels), cached for [`FRESH`].
//!
//! - The master's `INFO replication` names the replicas connected to it
//!   now. A replica it dropped (its link silent for `repl-timeout`) is not
//!   there, yet it is still a replica: behind Sentinel it may be promoted
//!   when it comes back, before it caught up. So behind Sentinel the count
//!   is of the replicas connected *or* listed by the sentinels
//!   (`SENTINEL REPLICAS`, see `sentinel/listed.rs`): a client that starts
//!   while a replica is away counts it as one that saw it did.
//! - A higher count is believed at once; a lower one only once the master
//!   has shown it for [`LOWER_AFTER`] and, behind Sentinel, while the
//!   sentinels still name that master, since a replica also goes away when
//!   it is promoted in place of a master that was cut off. A client that
//!   just started has nothing to compare with: on a plain `redis://` it
//!   believes the first count it reads (nothing promotes a replica there
//!   without an operator; `?replicas=N` fixes the number).

use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;
use redis::RedisResult;

use super::{route, ReplicaAck};
use crate::backends::redis::config::Replicas;
use crate::backends::redis::topology::server::Server;
use crate::backends::redis::Conn;
use crate::LockError;

/// How long a replica count read with `INFO replication` is used before it
/// is read again.
pub(crate) const FRESH: Duration = Duration::from_secs(1);

/// How long a master must show fewer replicas than before for `auto` to
/// ask for fewer (see [`ReplicaAck::auto_count`]): longer than the
/// sentinels take to announce a new master once they promoted a replica.
pub(crate) const LOWER_AFTER: Duration = Duration::from_secs(5);

/// `auto`'s replica count of one master.
#[derive(Debug, Clone)]
pub(super) struct Count {
    count: u32,
    /// When it was read.
    read: Instant,
    /// Since when the master has shown fewer replicas than `count`.
    lower_since: Option<Instant>,
    /// The master's replication id (`master_replid`): it changes when a
    /// replica is promoted, so a new master is told from an old one.
    replid: String,
}

impl Count {
    /// The count, while it is fresh.
    pub(super) fn fresh(&self) -> Option<u32> {
        (self.read.elapsed() < FRESH).then_some(self.count)
    }
}

impl ReplicaAck {
    /// At connect, with `?replicas=auto`: whether the server answers
    /// `INFO replication`, which `auto` reads to count the replicas every
    /// grant waits for. A server that refuses it (`rename-command INFO ""`,
    /// an ACL without `INFO`) is refused here, with the fix, rather than
    /// every acquire failing later.
    ///
    /// Why not fall back to no waiting: the default asks for every replica,
    /// and a grant no replica acknowledged is lost at a failover (a second
    /// holder); dlock does not lower that on its own. The URL says which:
    /// `?replicas=N`, or `?replicas=0`.
    pub(crate) async fn probe_auto(&self, conn: &Conn, server: &str) -> Result<(), LockError> {
        if self.replicas != Replicas::Auto {
            return Ok(());
        }
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let e = match route::<String>(conn, "", info).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_io_error() || e.is_timeout() => {
                return Err(LockError::backend(server.to_owned(), e))
            }
            Err(e) => e,
        };
        Err(LockError::invalid_option(format!(
            "`{server}`: the server refused `INFO replication` ({e}), which `?replicas=auto` (the \
             default) reads to count the replicas each grant waits for. Add `?replicas=N` to the \
             URL with the number of replicas the master has, or `?replicas=0` to wait for none \
             (a grant not yet replicated is then lost if a replica is promoted), or allow `INFO` \
             on the server"
        )))
    }

    /// `auto`'s count for the master of `lock_key`: cached, or read with
    /// `INFO replication` (and the sentinels' list) when stale or when
    /// `fresh` is asked.
    pub(super) async fn auto_count(
        &self,
        conn: &Conn,
        lock_key: &str,
        fresh: bool,
    ) -> RedisResult<u32> {
        let slot = matches!(conn, Conn::Cluster(_)).then(|| Slot::for_key(lock_key));
        if !fresh
            && let Some(known) = self.lock().get(&slot)
            && known.read.elapsed() < FRESH
        {
            return Ok(known.count);
        }
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let info: String = route(conn, lock_key, info).await?;
        let replication = replication(&info);
        let seen = with_listed(conn, &replication).await;
        let replid = replication.replid;
        let now = Instant::now();
        // Another replication id: another master (a promoted replica takes
        // a new one), whose own count is the one to go by.
        let known = self
            .lock()
            .get(&slot)
            .cloned()
            .filter(|k| k.replid == replid);
        let count = match known {
            // Fewer replicas than before. A replica that went away is one
            // thing; but a replica also goes away when it is promoted while
            // this master was cut off: a paused master the sentinels
            // replaced wakes up still a master, runs the writes queued for
            // it, and would grant leases the new master never sees, with no
            // replica left to wait for. So the lower count stands only once
            // it has been seen for `LOWER_AFTER`, and, behind Sentinel, only
            // while the sentinels still name this master (if they name
            // another, requests follow it from now on).
            Some(known) if seen < known.count => {
                let since = known.lower_since.unwrap_or(now);
                if now.duration_since(since) < LOWER_AFTER || !still_the_master(conn).await? {
                    let count = known.count;
                    self.lock().insert(
                        slot,
                        Count {
                            read: now,
                            lower_since: Some(since),
                            ..known
                        },
                    );
                    return Ok(count);
                }
                seen
            }
            _ => seen,
        };
        self.lock().insert(
            slot,
            Count {
                count,
                read: now,
                lower_since: None,
                replid,
            },
        );
        Ok(count)
    }
}

/// Behind Sentinel, the replicas connected to the master or listed by the
/// sentinels, each once; elsewhere the connected ones. If no sentinel
/// answers, the connected ones: while no sentinel runs, none promotes a
/// replica (and a lower count still waits [`LOWER_AFTER`]).
async fn with_listed(conn: &Conn, replication: &Replication) -> u32 {
    let Conn::Single(Server::Followed(sentinel)) = conn else {
        return replication.connected;
    };
    match sentinel.counted_replicas(&sentinel.master_addr()).await {
        Ok(mut addrs) => {
            addrs.extend(replication.addrs.iter().cloned());
            addrs.sort();
            addrs.dedup();
            u32::try_from(addrs.len())
                .unwrap_or(u32::MAX)
                .max(replication.connected)
        }
        Err(e) => {
            tracing::debug!(error = %e, "the sentinels did not list the replicas; counting the connected ones");
            replication.connected
        }
    }
}

/// Whether the node `conn` writes to is still the master: behind Sentinel,
/// whether the sentinels still name it (if not, requests follow the one
/// they name from now on); elsewhere nothing says otherwise.
async fn still_the_master(conn: &Conn) -> RedisResult<bool> {
    match conn {
        Conn::Single(Server::Followed(sentinel)) => Ok(!sentinel.refresh().await?),
        _ => Ok(true),
    }
}

/// What `INFO replication` says of a master's replicas.
#[derive(Debug, PartialEq, Eq)]
struct Replication {
    /// `connected_slaves:N`; 0 for any role but `master`.
    connected: u32,
    /// `ip:port` of each `slaveN:ip=…,port=…` line.
    addrs: Vec<String>,
    /// `master_replid:…`.
    replid: String,
}

/// Reads `INFO replication` (`role:master`, `connected_slaves:N`,
/// `slave0:ip=…,port=…,…`, `master_replid:…`); no replicas for any other
/// role.
fn replication(info: &str) -> Replication {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim_end().strip_prefix(name))
            .unwrap_or_default()
    };
    let replid = field("master_replid:").to_owned();
    if field("role:") != "master" {
        return Replication {
            connected: 0,
            addrs: Vec::new(),
            replid,
        };
    }
    let addrs = info
        .lines()
        .filter(|line| line.starts_with("slave") && line.contains(":ip="))
        .filter_map(|line| {
            let (_, fields) = line.trim_end().split_once(':')?;
            let value = |name: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            };
            Some(format!("{}:{}", value("ip")?, value("port")?))
        })
        .collect();
    Replication {
        connected: field("connected_slaves:").parse().unwrap_or(0),
        addrs,
        replid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_replication_gives_the_replicas_and_the_id() {
        let master = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=1,state=online,offset=1,lag=0\r\nslave1:ip=10.0.0.2,port=6380,state=wait_bgsave,offset=0,lag=0\r\nmaster_replid:abc\r\nmaster_replid2:000\r\n";
        assert_eq!(
            replication(master),
            Replication {
                connected: 2,
                addrs: vec!["127.0.0.1:1".to_owned(), "10.0.0.2:6380".to_owned()],
                replid: "abc".to_owned()
            }
        );
        let alone = "role:master\nconnected_slaves:0\nmaster_replid:def\n";
        assert_eq!(replication(alone).connected, 0);
        assert!(replication(alone).addrs.is_empty());
        assert_eq!(replication(alone).replid, "def");
        let a_replica =
            "role:slave\nmaster_host:127.0.0.1\nconnected_slaves:0\nmaster_replid:abc\n";
        assert_eq!(replication(a_replica).connected, 0);
        assert_eq!(replication(a_replica).replid, "abc");
        assert_eq!(replication("").connected, 0);
    }
}
