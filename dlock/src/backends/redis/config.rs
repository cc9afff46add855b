//! The backend's configuration: the `redis://`, `rediss://`,
//! `redis+cluster://` and `redis+sentinel://` URL forms (each also with TLS),
//! the replica acknowledgement they ask for, and the clients (with TLS).

use std::time::Duration;

mod clients;
mod layout;
mod replicas;
mod sentinel;
mod waiting;

#[cfg(feature = "tls")]
pub(super) use self::clients::tls_certificates;
pub(super) use self::clients::{client, tcp_settings, tls_cluster};
pub(crate) use self::layout::asks_for_redisson;
pub(super) use self::layout::without_layout;
use self::replicas::parse_replicas;
pub(crate) use self::replicas::{replica_timeout, Replicas};
pub(crate) use self::sentinel::SentinelTarget;
use self::sentinel::{refuse_open_sentinels, sentinel_target, SentinelQuery};
use self::waiting::{parse_foreign_share, DEFAULT_FOREIGN_SHARE, DEFAULT_RECHECK};
use crate::backends::fence_retention::{self, DEFAULT_FENCE_RETENTION};
use crate::url::{options, percent_decode, redact};
use crate::LockError;

/// What a Redis URL says, split into what dlock reads and what the `redis`
/// crate reads.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RedisOptions {
    /// One URL per node for the `redis` crate, without dlock's own parameters.
    pub(crate) nodes: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) tls: bool,
    /// `?ca=/path/ca.pem`: trust this CA instead of the system roots.
    pub(crate) ca_file: Option<String>,
    /// `?prefix=name`: the namespace of the keys (default `dlock`).
    pub(crate) prefix: String,
    /// `?client_name=`: the holder name written into each lock's owner
    /// token (default `hostname:pid`; see `crate::inspect`).
    pub(crate) client_name: Option<String>,
    /// `?timeout=<duration>` (or `?timeout_ms=N`): how long one request may
    /// take before it counts as failed (and retires its connection).
    pub(crate) response_timeout: Duration,
    /// `?tcp_keepalive=<duration>|0`: the idle time before TCP keep-alive
    /// probes on every socket to the servers (and the pause between them);
    /// `None`: off.
    pub(crate) tcp_keepalive: Option<Duration>,
    /// `?tcp_user_timeout=<duration>|0`: how long sent data may stay
    /// unacknowledged before the kernel closes the connection
    /// (`TCP_USER_TIMEOUT`, Linux); `None`: the system's default.
    pub(crate) tcp_user_timeout: Option<Duration>,
    /// `?recheck_ms=N`: the longest pause between a waiter's re-checks of a
    /// held key (`None`: `recheck_ms=0`, no re-check; see `recheck.rs`).
    pub(crate) recheck: Option<Duration>,
    /// `?replicas=auto|N`: how many replicas must acknowledge a write that
    /// grants or extends a lease.
    pub(crate) replicas: Replicas,
    /// `?replica_timeout=<duration>`: how long to wait for them (`None`:
    /// [`replica_timeout`] of the lease's ttl).
    pub(crate) replica_timeout: Option<Duration>,
    /// `?fence_retention=<duration>`: how long a key's fencing counter
    /// outlives the fence it last issued (default one day, at most 365 days;
    /// see `scripts.rs`'s `ACQUIRE_FUNCTIONS` for why it may expire).
    pub(crate) fence_retention: Duration,
    /// `?fence=on|off`: whether plain locks issue fencing tokens (default
    /// on). Off, the acquire keeps no fence counter and a lease's
    /// `fencing_token()` is `None`: for locks that save work rather than
    /// guard data (see the guarantees guide).
    pub(crate) fenced: bool,
    /// `?foreign_share=N`: the percentage of the time the key stays free for
    /// clients that do not queue while the queue hands it on (see
    /// `waiter_queue.rs`; default [`DEFAULT_FOREIGN_SHARE`]).
    pub(crate) foreign_share: u8,
    /// `?aof=true`: `WAITAOF` instead of `WAIT`: the master's own AOF and
    /// the replicas' fsynced (servers with `appendonly yes`, Redis 7.2+).
    pub(crate) aof: bool,
    /// `?eviction=accept`: connect to a server that may evict keys
    /// (`maxmemory` set, a `maxmemory-policy` other than `noeviction`);
    /// refused by default (see `eviction.rs`).
    pub(crate) eviction_accepted: bool,
    /// `redis+sentinel://`: where the sentinels are and which master to ask
    /// them for.
    pub(crate) sentinel: Option<SentinelTarget>,
    /// The URL as shown in errors and logs, password redacted.
    pub(crate) shown: String,
}

/// A Redis server's default port.
pub(crate) const REDIS_PORT: u16 = 6379;

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

pub(crate) const DEFAULT_PREFIX: &str = "dlock";
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The default idle time before keep-alive probes: a flow that died
/// silently while idle is noticed within about 5 + 3 x 5 s = 20 s (a busy
/// one sooner, by the request timeout or the user timeout).
const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(5);

/// The default `TCP_USER_TIMEOUT`: twice the request timeout, so that the
/// request timeout (which retires the connection) speaks first, and a
/// connection with unacknowledged data closes soon after.
const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
impl RedisOptions {
    pub(crate) fn parse(url: &str) -> Result<Self, LockError> {
        let shown = redact(url);
        let bad = |why: &str| LockError::invalid_option(format!("`{shown}`: {why}"));
        // dlock's own split first: it refuses a raw `/`, `?` or `#` in the
        // credentials before the `redis` crate would read a piece of the
        // password as a host name and look it up.
        let parts = crate::url::parts::split(url).map_err(|why| bad(&why))?;
        let scheme = parts.scheme;
        let rest = &url[scheme.len() + "://".len()..];
        let (cluster, sentinel, tls, node_scheme) = match scheme {
            "redis" => (false, false, false, "redis"),
            "rediss" => (false, false, true, "rediss"),
            "redis+cluster" => (true, false, false, "redis"),
            "rediss+cluster" => (true, false, true, "rediss"),
            "redis+sentinel" => (false, true, false, "redis"),
            "rediss+sentinel" => (false, true, true, "rediss"),
            other => return Err(bad(&format!("`{other}` is not a Redis scheme"))),
        };
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut ca_file = None;
        let mut prefix = DEFAULT_PREFIX.to_owned();
        let mut client_name = None;
        let mut response_timeout = DEFAULT_RESPONSE_TIMEOUT;
        let mut tcp_keepalive = Some(DEFAULT_TCP_KEEPALIVE);
        let mut tcp_user_timeout = Some(DEFAULT_TCP_USER_TIMEOUT);
        let mut recheck = Some(DEFAULT_RECHECK);
        let mut replicas = Replicas::Auto;
        let mut replica_timeout = None;
        let mut aof = false;
        let mut eviction_accepted = false;
        let mut fence_retention = DEFAULT_FENCE_RETENTION;
        let mut fenced = true;
        let mut foreign_share = DEFAULT_FOREIGN_SHARE;
        let mut sentinel_query = SentinelQuery::default();
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "replicas" => replicas = parse_replicas(value).map_err(|why| bad(&why))?,
                "aof" => {
                    aof = match value {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => {
                            return Err(bad(&format!(
                                "`aof={value}` is neither true nor false (true waits for the AOF fsync of the master and the replicas: WAITAOF)"
                            )))
                        }
                    };
                }
                "eviction" => {
                    eviction_accepted = match value {
                        "accept" => true,
                        "refuse" => false,
                        _ => {
                            return Err(bad(&format!(
                                "`eviction={value}` is neither accept nor refuse (accept connects to a server whose maxmemory-policy may evict lock keys; the default, refuse, does not)"
                            )))
                        }
                    };
                }
                "fence" => {
                    fenced = match value {
                        "on" => true,
                        "off" => false,
                        _ => {
                            return Err(bad(&format!(
                                "`fence={value}` is neither on nor off (off: plain locks issue no fencing token, `fencing_token()` is None, for locks that save work rather than guard data; the default is on)"
                            )))
                        }
                    };
                }
                "fence_retention" => {
                    fence_retention = fence_retention::parse(value).map_err(|why| bad(&why))?;
                }
                "foreign_share" => {
                    foreign_share = parse_foreign_share(value).map_err(|why| bad(&why))?;
                }
                "replica_timeout" => {
                    replica_timeout =
                        Some(options::duration(name, value).map_err(|why| bad(&why))?);
                }
                "db" | "sentinel_user" | "sentinel_password" | "sentinel_auth"
                | "replica_gone_after"
                    if sentinel =>
                {
                    sentinel_query.take(name, value).map_err(|why| bad(&why))?;
                }
                "ca" => {
                    ca_file = Some(percent_decode(value).map_err(|e| bad(&format!("`ca`: {e}")))?)
                }
                "prefix" => prefix = crate::url::prefix::parse(value).map_err(|why| bad(&why))?,
                "client_name" => {
                    client_name = Some(
                        crate::backend::holder::check_client_name(value)
                            .map_err(|e| bad(&e.to_string()))?,
                    )
                }
                "timeout_ms" => {
                    response_timeout =
                        options::millis(name, value, false).map_err(|why| bad(&why))?;
                }
                "timeout" => {
                    response_timeout = options::duration(name, value).map_err(|why| bad(&why))?;
                }
                "tcp_keepalive" => {
                    tcp_keepalive =
                        options::duration_or_off(name, value).map_err(|why| bad(&why))?;
                }
                "tcp_user_timeout" => {
                    tcp_user_timeout =
                        options::duration_or_off(name, value).map_err(|why| bad(&why))?;
                }
                "recheck_ms" => {
                    let every = options::millis(name, value, true).map_err(|why| bad(&why))?;
                    recheck = (!every.is_zero()).then_some(every);
                }
                _ if sentinel => {
                    // After a password, a "parameter" may be the rest of a
                    // password written with a raw `&`: not quoted.
                    let after_password = sentinel_query.password.is_some();
                    let why = options::unknown(
                        name,
                        "Redis Sentinel",
                        options::REDIS_SENTINEL,
                        after_password,
                    );
                    return Err(bad(&why));
                }
                "layout" => return Err(bad(&layout::layout_not_here(value))),
                // The `redis` crate's own: RESP2 or RESP3.
                "protocol" => passed_on.push(pair),
                _ => return Err(bad(&options::unknown(name, "Redis", options::REDIS, false))),
            }
        }
        if ca_file.is_some() && !tls {
            return Err(bad("`ca` needs TLS; use rediss://"));
        }
        let query = if passed_on.is_empty() {
            String::new()
        } else {
            format!("?{}", passed_on.join("&"))
        };
        let target = if sentinel {
            let open_sentinels = sentinel_query.open_sentinels;
            let target = sentinel_target(before_query, sentinel_query).map_err(|why| bad(&why))?;
            refuse_open_sentinels(&target, tls, open_sentinels).map_err(|why| bad(&why))?;
            Some(target)
        } else {
            None
        };
        let nodes = if let Some(target) = &target {
            // The sentinels, for the `redis` crate's sentinel client.
            target
                .sentinels
                .iter()
                .map(|(host, port)| format!("{node_scheme}://{host}:{port}"))
                .collect()
        } else if cluster {
            // `user:pass@h1:1,h2:2/db` → one URL per host, each with the credentials.
            let (auth, hosts) = match before_query.rsplit_once('@') {
                Some((auth, hosts)) => (format!("{auth}@"), hosts),
                None => (String::new(), before_query),
            };
            let hosts = hosts.trim_end_matches('/');
            if hosts.contains('/') {
                return Err(bad(
                    "a cluster URL has no database number (clusters only have db 0)",
                ));
            }
            crate::url::parts::hosts(hosts, REDIS_PORT)
                .map_err(|why| bad(&why))?
                .iter()
                .map(|host| format!("{node_scheme}://{auth}{host}{query}"))
                .collect()
        } else {
            if parts.hosts.contains(',') {
                return Err(bad(
                    "give one host (host:port); for several use redis+cluster:// or redlock://",
                ));
            }
            crate::url::parts::hosts(parts.hosts, REDIS_PORT).map_err(|why| bad(&why))?;
            vec![format!("{node_scheme}://{before_query}{query}")]
        };
        Ok(RedisOptions {
            nodes,
            cluster,
            tls,
            ca_file,
            prefix,
            client_name,
            response_timeout,
            tcp_keepalive,
            tcp_user_timeout,
            recheck,
            replicas,
            replica_timeout,
            fence_retention,
            fenced,
            foreign_share,
            aof,
            eviction_accepted,
            sentinel: target,
            shown,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::backends::redis::config::*;

    #[test]
    fn single_node_with_our_parameters_taken_out() {
        let o =
            RedisOptions::parse("redis://u:pw@127.0.0.1:6379/2?prefix=app&timeout_ms=250").unwrap();
        assert_eq!(o.nodes, ["redis://u:pw@127.0.0.1:6379/2"]);
        assert_eq!(o.prefix, "app");
        assert_eq!(o.response_timeout, Duration::from_millis(250));
        assert_eq!(
            o.shown,
            "redis://u:***@127.0.0.1:6379/2?prefix=app&timeout_ms=250"
        );
        assert!(!o.cluster && !o.tls);
        assert_eq!(o.recheck, Some(DEFAULT_RECHECK));
    }

    #[test]
    fn fence_is_on_unless_off_on_every_form() {
        for url in [
            "redis://h:1",
            "rediss://h:1",
            "redis+cluster://h:1,h:2",
            "redis+sentinel://h:1/mm",
        ] {
            assert!(RedisOptions::parse(url).unwrap().fenced, "{url}");
            let on = RedisOptions::parse(&format!("{url}?fence=on")).unwrap();
            assert!(on.fenced, "{url}");
            let off = RedisOptions::parse(&format!("{url}?fence=off")).unwrap();
            assert!(!off.fenced, "{url}");
            assert!(
                off.nodes.iter().all(|n| !n.contains("fence")),
                "not passed on to the client: {:?}",
                off.nodes
            );
        }
        for (url, says) in [
            ("redis://h:1?fence=no", "`fence=no` is neither on nor off"),
            ("redis://h:1?fence", "`fence=` is neither on nor off"),
        ] {
            let e = RedisOptions::parse(url).unwrap_err();
            assert!(matches!(e, LockError::InvalidOption { .. }), "{url}: {e:?}");
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
        assert!(
            RedisOptions::parse("redis+cluster://h:1,h:2?fence=on")
                .unwrap()
                .fenced
        );
    }

    #[test]
    fn fence_retention_defaults_to_a_day_on_every_form() {
        for url in [
            "redis://h:1",
            "rediss://h:1",
            "redis+cluster://h:1,h:2",
            "redis+sentinel://h:1/mm",
        ] {
            let o = RedisOptions::parse(url).unwrap();
            assert_eq!(o.fence_retention, Duration::from_secs(86_400), "{url}");
            let o = RedisOptions::parse(&format!("{url}?fence_retention=1h%2030m")).unwrap();
            assert_eq!(o.fence_retention, Duration::from_secs(5400), "{url}");
            assert!(
                o.nodes.iter().all(|n| !n.contains("fence_retention")),
                "not passed on to the client: {:?}",
                o.nodes
            );
        }
        let o = RedisOptions::parse("redis://h:1?fence_retention=365d").unwrap();
        assert_eq!(
            o.fence_retention,
            crate::backends::fence_retention::MAX_FENCE_RETENTION
        );
    }

    #[test]
    fn cluster_hosts_each_get_the_credentials() {
        let o = RedisOptions::parse("redis+cluster://u:pw@h1:1,h2:2").unwrap();
        assert_eq!(o.nodes, ["redis://u:pw@h1:1", "redis://u:pw@h2:2"]);
        assert!(o.cluster);
    }

    #[test]
    fn tls_with_a_ca_file() {
        let o = RedisOptions::parse("rediss://h:1?ca=/tmp/ca.pem").unwrap();
        assert_eq!(o.ca_file.as_deref(), Some("/tmp/ca.pem"));
        assert!(o.tls);
    }

    #[test]
    fn bad_urls_say_what_to_write() {
        for (url, says) in [
            ("redis://h:1?ca=/x", "needs TLS"),
            ("redis://h1:1,h2:2", "one host"),
            ("redis://h:1?timeout_ms=0", "positive"),
            ("redis+cluster://h1:1,,h2:2", "empty host"),
            ("redis://:secret@h:1?prefix=", "prefix"),
            ("redis://:secret@h:1?recheck_ms=soon", "recheck_ms=soon"),
            ("redis://:secret@h:1?recheck_ms=-1", "recheck_ms=-1"),
            ("redis://:secret@h:1?replicas=all", "replicas=all"),
            ("redis://:secret@h:1?replica_timeout=0", "replica_timeout=0"),
            (
                "redis://:secret@h:1?replica_timeout=soon",
                "replica_timeout=soon",
            ),
            (
                "redis://:secret@h:1?fence_retention=0s",
                "`fence_retention=0s` must be longer than zero",
            ),
            (
                "redis://:secret@h:1?fence_retention=0",
                "`fence_retention=0` must be longer than zero",
            ),
            (
                "redis+cluster://:secret@h:1?fence_retention=soon",
                "`fence_retention=soon` is not a duration",
            ),
            (
                "redis://:secret@h:1?fence_retention=400days",
                "`fence_retention=400days` is longer than the maximum of 365 days",
            ),
            (
                "redis://:secret@h:1?fence_retention_ms=5000",
                "did you mean `fence_retention`?",
            ),
            ("redis+sentinel://:secret@h:1", "master"),
            ("redis+sentinel://:secret@h:1/", "master name"),
            ("redis+sentinel://:secret@h:x/mm", "not a port"),
            ("redis+sentinel://:secret@h:1,,h:2/mm", "empty host"),
            ("redis+sentinel://:secret@h:1/mm?db=-1", "db=-1"),
            (
                "redis+sentinel://:secret@h:1/mm?replica_gone_after=soon",
                "`replica_gone_after=soon` is not a duration",
            ),
            (
                "redis://:secret@h:1?replica_gone_after=1m",
                "replica_gone_after",
            ),
            (
                "redis+sentinel://:secret@h:1/mm?timeout=5",
                "`timeout=5` is not a duration",
            ),
            (
                "redis+sentinel://:secret@h:1/mm?timeot=5s",
                "unknown parameter `timeot`; did you mean `timeout`?",
            ),
            (
                "redis://:secret@h:1?tcp_keepalive=soon",
                "`tcp_keepalive=soon` is not a duration",
            ),
            (
                "redis+sentinel://:secret@h:1/mm?sentinel_password=%zz",
                "sentinel_password",
            ),
        ] {
            let msg = RedisOptions::parse(url).unwrap_err().to_string();
            assert!(msg.contains(says), "{url}: {msg}");
            assert!(!msg.contains("secret"), "{msg}");
        }
    }
}
