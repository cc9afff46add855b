//! The query parameters of every backend's URL, read by one set of rules:
//! an unknown parameter, or one of another backend, is an error that names
//! it and the closest known name; durations are humantime (`250ms`, `5s`,
//! `1m 30s`), as the attribute's `ttl` and `wait` are, with one error text;
//! a parameter named `…_ms` takes a number of milliseconds.

use std::time::Duration;

/// Every backend's parameters, to tell "unknown" from "another backend's".
const EVERY_BACKEND: &[(&str, &[&str])] = &[
    ("Redis", REDIS),
    ("Redis Sentinel", REDIS_SENTINEL),
    ("Redlock", REDLOCK),
    ("etcd", ETCD),
    ("ZooKeeper", ZOOKEEPER),
    ("PostgreSQL", POSTGRES),
    ("file", FILE),
    ("MySQL", MYSQL),
];

/// What every Redis form takes (Redlock: each master's).
const REDIS_ANY: [&str; 11] = [
    "prefix",
    "client_name",
    "timeout",
    "tcp_keepalive",
    "tcp_user_timeout",
    "timeout_ms",
    "recheck_ms",
    "replicas",
    "replica_timeout",
    "aof",
    "eviction",
];
/// `redis://`, `rediss://` and the Cluster forms.
pub(crate) const REDIS: &[&str] = &join::<11, 5, 16>(
    REDIS_ANY,
    [
        "ca",
        "protocol",
        "fence",
        "fence_retention",
        "foreign_share",
    ],
);
/// `redis+sentinel://` and `rediss+sentinel://`.
pub(crate) const REDIS_SENTINEL: &[&str] = &join::<11, 9, 20>(
    REDIS_ANY,
    [
        "ca",
        "db",
        "sentinel_user",
        "sentinel_password",
        "sentinel_auth",
        "fence",
        "fence_retention",
        "foreign_share",
        "replica_gone_after",
    ],
);
/// `redlock://`: its own, and each master's Redis ones.
pub(crate) const REDLOCK: &[&str] =
    &join::<2, 11, 13>(["node_timeout_ms", "restart_quarantine_ms"], REDIS_ANY);
/// `etcd://` and `etcds://`.
pub(crate) const ETCD: &[&str] = &[
    "prefix",
    "client_name",
    "timeout",
    "tcp_keepalive",
    "ca",
    "domain",
    "compaction",
];
/// `postgres://` and `postgresql://`: dlock's own (the libpq ones are
/// `backends/postgres/config.rs`'s `LIBPQ`).
pub(crate) const POSTGRES: &[&str] = &[
    "prefix",
    "client_name",
    "timeout",
    "tcp_keepalive",
    "sessions",
    "schema",
    "session_timeout",
    "fence_retention",
];
/// `file:///path/to/dir`.
pub(crate) const FILE: &[&str] = &["prefix", "client_name", "mode", "shared_dir"];
/// `mysql://` and `mysqls://`.
pub(crate) const MYSQL: &[&str] = &[
    "prefix",
    "client_name",
    "timeout",
    "tcp_keepalive",
    "sessions",
    "session_timeout",
    "fence_retention",
    "ssl-mode",
    "ssl-ca",
];
/// `zk://` and `zks://`.
pub(crate) const ZOOKEEPER: &[&str] = &[
    "session_timeout",
    "timeout",
    "prefix",
    "client_name",
    "acl",
    "ca",
    "cert",
    "key",
];

/// `first` then `then`, as one list; `N` must be `F + T` (checked when
/// the constant is built).
const fn join<const F: usize, const T: usize, const N: usize>(
    first: [&'static str; F],
    then: [&'static str; T],
) -> [&'static str; N] {
    assert!(F + T == N, "N is not F + T");
    let mut all = [""; N];
    let mut i = 0;
    while i < F {
        all[i] = first[i];
        i += 1;
    }
    while i < N {
        all[i] = then[i - F];
        i += 1;
    }
    all
}

/// The error for a parameter `name` that `backend`'s URLs (taking `known`)
/// do not take. A parameter after a `…password` one is not quoted: it may
/// be the rest of a password written with a raw `&`.
pub(crate) fn unknown(name: &str, backend: &str, known: &[&str], after_password: bool) -> String {
    let takes = format!("{backend} URLs take {}", known.join(", "));
    if after_password {
        return format!(
            "a parameter after a password parameter is not one {takes} (percent-encode a `&` in a password as `%26`)"
        );
    }
    let other = EVERY_BACKEND
        .iter()
        .find(|(other, names)| *other != backend && names.contains(&name) && !known.contains(&name))
        .map(|(other, _)| *other);
    let what = match (closest(name, known), other) {
        (Some(near), Some(other)) => format!(
            "unknown parameter `{name}`; did you mean `{near}`? (`{name}` is a parameter of {other} URLs)"
        ),
        (Some(near), None) => format!("unknown parameter `{name}`; did you mean `{near}`?"),
        (None, Some(other)) => {
            format!("`{name}` is a parameter of {other} URLs, not of {backend} ones")
        }
        (None, None) => format!("unknown parameter `{name}`"),
    };
    format!("{what}; {takes}")
}

/// The known name nearest to `name` by edit distance, if it is near enough
/// to be a typo (at most a third of its length, and at least 2).
fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(2);
    known
        .iter()
        .map(|k| (strsim::levenshtein(name, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
        .or_else(|| {
            // `timeout` for `timeout_ms`: a known name that starts with it.
            known
                .iter()
                .find(|k| k.starts_with(name) || name.starts_with(*k))
                .copied()
                .filter(|_| !name.is_empty())
        })
}

/// A positive humantime duration (`250ms`, `5s`, `1m 30s`), as the
/// attribute's `ttl` and `wait` take: the one duration syntax of dlock.
// The file backend's URL takes no duration.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "etcd",
        feature = "zookeeper",
        feature = "postgres"
    )),
    allow(dead_code)
)]
pub(crate) fn duration(name: &str, value: &str) -> Result<Duration, String> {
    // Written in a URL, `1m 30s` is `1m%2030s`.
    let decoded = super::percent_decode(value).unwrap_or_else(|_| value.to_owned());
    match humantime::parse_duration(&decoded) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(format!("`{name}={value}` must be longer than zero")),
        Err(e) => Err(format!(
            "`{name}={value}` is not a duration ({e}); write e.g. `{name}=250ms`, `{name}=5s` or `{name}=1m 30s`"
        )),
    }
}

#[cfg(any(
    feature = "redis",
    feature = "etcd",
    feature = "postgres",
    feature = "mysql"
))]
/// A duration that `0` turns off (`None`).
pub(crate) fn duration_or_off(name: &str, value: &str) -> Result<Option<Duration>, String> {
    if value == "0" {
        return Ok(None);
    }
    duration(name, value)
        .map(Some)
        .map_err(|why| format!("{why} (or `{name}=0` to turn it off)"))
}

#[cfg(feature = "redis")]
/// A `…_ms` parameter: a number of milliseconds; `zero` says whether 0 is
/// allowed (it turns something off).
pub(crate) fn millis(name: &str, value: &str, zero: bool) -> Result<Duration, String> {
    match value.parse::<u64>() {
        Ok(0) if !zero => Err(format!(
            "`{name}={value}` must be a positive number of milliseconds"
        )),
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) => Err(format!(
            "`{name}={value}` is not a number of milliseconds{}",
            if zero { " (0 turns it off)" } else { "" }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_the_closest_name() {
        let err = unknown("prefx", "etcd", ETCD, false);
        assert!(err.contains("did you mean `prefix`?"), "{err}");
        let err = unknown("timeot", "Redis", REDIS, false);
        assert!(err.contains("did you mean `timeout`?"), "{err}");
        let err = unknown("colour", "etcd", ETCD, false);
        assert!(
            err.starts_with("unknown parameter `colour`; etcd URLs take"),
            "{err}"
        );
    }

    #[test]
    fn another_backends_parameter_is_named_as_such() {
        let err = unknown("session_timeout", "Redis", REDIS, false);
        assert!(err.contains("is a parameter of ZooKeeper URLs"), "{err}");
        let err = unknown("node_timeout_ms", "Redis", REDIS, false);
        assert!(err.contains("Redlock"), "{err}");
    }

    #[test]
    fn a_parameter_after_a_password_is_not_quoted() {
        let err = unknown("Tail9Zz", "Redis Sentinel", REDIS_SENTINEL, true);
        assert!(!err.contains("Tail9Zz"), "{err}");
    }

    #[test]
    fn one_duration_syntax() {
        assert_eq!(duration("t", "250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("t", "1m 30s"), Ok(Duration::from_secs(90)));
        assert!(duration("t", "0s")
            .unwrap_err()
            .contains("longer than zero"));
        assert!(duration("t", "5")
            .unwrap_err()
            .contains("write e.g. `t=250ms`"));
        assert!(duration("t", "soon").is_err());
    }

    #[cfg(feature = "redis")]
    #[test]
    fn milliseconds() {
        assert_eq!(millis("x_ms", "0", true), Ok(Duration::ZERO));
        assert!(millis("x_ms", "0", false).is_err());
        assert!(millis("x_ms", "-1", false).is_err());
    }
}
