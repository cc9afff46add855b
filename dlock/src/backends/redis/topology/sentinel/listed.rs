//! The replicas the sentinels know for the master (`SENTINEL REPLICAS`),
//! for `?replicas=auto` (see `replicas/count.rs`).
//!
//! Why ask the sentinels and not only the master: a master lists the
//! replicas connected to it right now (`INFO replication`), and forgets a
//! replica once it dropped its link (after `repl-timeout`). Such a replica
//! is still a replica: when it comes back, the sentinels may promote it
//! before it caught up with the master, and every grant it never received
//! is gone. The sentinels keep listing it, flagged `s_down` while it does
//! not answer, until an operator's `SENTINEL RESET`: a client that starts
//! while it is away still counts it.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{RedisError, RedisResult, Value};

use super::{Inner, Sentinel};
use crate::lease::background;

/// One replica as the sentinels list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedReplica {
    /// `ip:port`, as the master's `INFO replication` also names it.
    pub(crate) addr: String,
    /// How long ago it last answered the sentinels; `None` if it never
    /// answered their `INFO` (the old master of a failover, which the
    /// sentinels list as a replica of the new one from the start, while
    /// it is still down).
    pub(crate) heard_ago: Option<Duration>,
    /// `promoted`: it is being made the master (a failover in progress).
    pub(crate) promoted: bool,
}

impl Sentinel {
    /// The addresses (`ip:port`) of the replicas a grant must reach, as the
    /// sentinels list them for the master `master_addr` (see [`counted`]).
    pub(crate) async fn counted_replicas(&self, master_addr: &str) -> RedisResult<Vec<String>> {
        let listed = self.listed_replicas().await?;
        Ok(counted(
            &listed,
            master_addr,
            self.inner.target.replica_gone_after,
        ))
    }

    /// The replicas the sentinels list for the master, asked of one
    /// sentinel over a connection kept for it (opened again if it failed).
    async fn listed_replicas(&self) -> RedisResult<Vec<ListedReplica>> {
        let inner = self.inner.clone();
        let limit = self.inner.response_timeout;
        let asked = background::run(async move { inner.ask_replicas().await });
        tokio::time::timeout(limit, asked).await.map_err(|_| {
            RedisError::from((
                redis::ErrorKind::Io,
                "no sentinel listed the replicas in time",
            ))
        })?
    }
}

/// Which listed replicas a grant must reach: every one, connected or not,
/// except
/// - one being `promoted` (a failover in progress: it is the next master,
///   and requests follow it), and the master itself;
/// - one the sentinels never heard from: the old master of a failover,
///   listed as a replica of the new one while it is down. It never had the
///   new master's data; counting it would stop every grant until it is
///   back. Once back and answering, it counts;
/// - with `?replica_gone_after=`, one the sentinels have not heard from
///   for that long: the trade-off of availability against the case of a
///   replica that comes back and is promoted before it caught up.
pub(crate) fn counted(
    listed: &[ListedReplica],
    master_addr: &str,
    gone_after: Option<Duration>,
) -> Vec<String> {
    let mut addrs: Vec<String> = listed
        .iter()
        .filter(|r| !r.promoted && r.addr != master_addr)
        .filter(|r| match (r.heard_ago, gone_after) {
            (None, _) => false,
            (Some(ago), Some(limit)) => ago <= limit,
            (Some(_), None) => true,
        })
        .map(|r| r.addr.clone())
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs
}

impl Inner {
    async fn ask_replicas(&self) -> RedisResult<Vec<ListedReplica>> {
        let mut kept = self.listing.lock().await;
        let mut conn = match kept.take() {
            Some(conn) => conn,
            None => self.sentinel_connection().await?,
        };
        let answer: Value = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(&self.target.master)
            .query_async(&mut conn)
            .await?;
        // Kept only after an answer: a failed one is opened again next time.
        *kept = Some(conn);
        Ok(parse_replicas(&answer))
    }

    async fn sentinel_connection(&self) -> RedisResult<MultiplexedConnection> {
        let client = self
            .sentinels
            .lock()
            .await
            .async_get_sentinel_client()
            .await?;
        client.get_multiplexed_async_connection().await
    }
}

/// The entries of a `SENTINEL REPLICAS` answer: each a flat list of field
/// names and values (RESP2) or a map (RESP3). An entry without `ip` and
/// `port` is skipped.
fn parse_replicas(answer: &Value) -> Vec<ListedReplica> {
    let Value::Array(entries) = answer else {
        return Vec::new();
    };
    entries.iter().filter_map(parse_entry).collect()
}

fn parse_entry(entry: &Value) -> Option<ListedReplica> {
    let pairs: Vec<(String, String)> = match entry {
        Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?)?)))
            .collect(),
        Value::Map(map) => map
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => return None,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let addr = format!("{}:{}", field("ip")?, field("port")?);
    let flags = field("flags").unwrap_or_default();
    let down = flags
        .split(',')
        .any(|f| f == "s_down" || f == "disconnected");
    let millis = |name: &str| field(name).and_then(|ms| ms.parse::<u64>().ok());
    // `info-refresh` is the milliseconds since the last INFO answer, and 0
    // if there never was one; `last-ok-ping-reply` those since the last
    // answer to the PING sent every second (INFO comes every 10 s).
    let heard_ago = match millis("info-refresh") {
        Some(0) if down => None,
        None => None,
        Some(info) => Some(Duration::from_millis(
            millis("last-ok-ping-reply").unwrap_or(info),
        )),
    };
    Some(ListedReplica {
        addr,
        heard_ago,
        promoted: flags.split(',').any(|f| f == "promoted"),
    })
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fields: &[(&str, &str)]) -> Value {
        Value::Array(
            fields
                .iter()
                .flat_map(|(k, v)| {
                    [
                        Value::BulkString(k.as_bytes().to_vec()),
                        Value::BulkString(v.as_bytes().to_vec()),
                    ]
                })
                .collect(),
        )
    }

    #[test]
    fn reads_each_replica_and_when_the_sentinels_last_heard_from_it() {
        let answer = Value::Array(vec![
            // Up.
            entry(&[
                ("name", "127.0.0.1:2"),
                ("ip", "127.0.0.1"),
                ("port", "2"),
                ("flags", "slave"),
                ("info-refresh", "869"),
            ]),
            // Paused: still heard from 9.8 s ago.
            entry(&[
                ("ip", "127.0.0.1"),
                ("port", "3"),
                ("flags", "s_down,slave"),
                ("last-ok-ping-reply", "9846"),
                ("info-refresh", "12000"),
            ]),
            // The old master of a failover, never heard from as a replica.
            entry(&[
                ("ip", "127.0.0.1"),
                ("port", "1"),
                ("flags", "s_down,slave,disconnected"),
                ("info-refresh", "0"),
            ]),
            entry(&[
                ("ip", "127.0.0.1"),
                ("port", "4"),
                ("flags", "slave,promoted"),
                ("info-refresh", "12"),
            ]),
            entry(&[("name", "no address")]),
        ]);
        let listed = parse_replicas(&answer);
        let seen: Vec<(&str, Option<u64>, bool)> = listed
            .iter()
            .map(|r| {
                (
                    r.addr.as_str(),
                    r.heard_ago.map(|d| d.as_millis() as u64),
                    r.promoted,
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                ("127.0.0.1:2", Some(869), false),
                ("127.0.0.1:3", Some(9846), false),
                ("127.0.0.1:1", None, false),
                ("127.0.0.1:4", Some(12), true),
            ]
        );
        assert!(parse_replicas(&Value::Nil).is_empty());

        // Counted: the up one and the paused one; not the old master never
        // heard from, the one being promoted, nor the master itself.
        assert_eq!(
            counted(&listed, "127.0.0.1:2", None),
            vec!["127.0.0.1:3".to_owned()]
        );
        assert_eq!(
            counted(&listed, "127.0.0.1:9", None),
            vec!["127.0.0.1:2".to_owned(), "127.0.0.1:3".to_owned()]
        );
        // `replica_gone_after=5s`: the paused one, last heard 9.8 s ago, no more.
        assert_eq!(
            counted(&listed, "127.0.0.1:9", Some(Duration::from_secs(5))),
            vec!["127.0.0.1:2".to_owned()]
        );
    }

    #[test]
    fn reads_a_resp3_map_too() {
        let answer = Value::Array(vec![Value::Map(vec![
            (
                Value::SimpleString("ip".into()),
                Value::BulkString(b"10.0.0.1".to_vec()),
            ),
            (
                Value::SimpleString("port".into()),
                Value::BulkString(b"6379".to_vec()),
            ),
            (Value::SimpleString("info-refresh".into()), Value::Int(5)),
        ])]);
        let listed = parse_replicas(&answer);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].addr, "10.0.0.1:6379");
        assert_eq!(listed[0].heard_ago, Some(Duration::from_millis(5)));
    }
}
