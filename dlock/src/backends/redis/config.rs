//! The backend's configuration: the `redis://`, `rediss://` and
//! `redis+cluster://` URL forms, and the clients (with TLS) they ask for.

use std::time::Duration;

use crate::url::redact;
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
    /// `?timeout_ms=N`: how long one request may take before it counts as failed.
    pub(crate) response_timeout: Duration,
    /// `?recheck_ms=N`: the longest pause between a waiter's re-checks of a
    /// held key (`None`: `recheck_ms=0`, no re-check; see `recheck.rs`).
    pub(crate) recheck: Option<Duration>,
    /// The URL as shown in errors and logs, password redacted.
    pub(crate) shown: String,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

pub(crate) const DEFAULT_PREFIX: &str = "dlock";
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default cap of a waiter's re-checks: a release that announced itself
/// nowhere is noticed within about this long.
pub(crate) const DEFAULT_RECHECK: Duration = Duration::from_secs(1);

impl RedisOptions {
    pub(crate) fn parse(url: &str) -> Result<Self, LockError> {
        let shown = redact(url);
        let bad = |why: &str| LockError::invalid_option(format!("`{shown}`: {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("not a URL; write redis://host:port"))?;
        let (cluster, tls, node_scheme) = match scheme {
            "redis" => (false, false, "redis"),
            "rediss" => (false, true, "rediss"),
            "redis+cluster" => (true, false, "redis"),
            "rediss+cluster" => (true, true, "rediss"),
            other => return Err(bad(&format!("`{other}` is not a Redis scheme"))),
        };
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut ca_file = None;
        let mut prefix = DEFAULT_PREFIX.to_owned();
        let mut response_timeout = DEFAULT_RESPONSE_TIMEOUT;
        let mut recheck = Some(DEFAULT_RECHECK);
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "ca" => ca_file = Some(value.to_owned()),
                "prefix" if !value.is_empty() => prefix = value.to_owned(),
                "prefix" => return Err(bad("`prefix` is empty; give a name, e.g. ?prefix=dlock")),
                "timeout_ms" => {
                    let ms: u64 = value.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                        bad(&format!(
                            "`timeout_ms={value}` is not a positive number of milliseconds"
                        ))
                    })?;
                    response_timeout = Duration::from_millis(ms);
                }
                "recheck_ms" => {
                    let ms: u64 = value.parse().map_err(|_| {
                        bad(&format!(
                            "`recheck_ms={value}` is not a number of milliseconds (0 turns the re-check off)"
                        ))
                    })?;
                    recheck = (ms > 0).then(|| Duration::from_millis(ms));
                }
                _ => passed_on.push(pair),
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
        let nodes = if cluster {
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
            hosts
                .split(',')
                .map(|host| {
                    if host.is_empty() {
                        Err(bad(
                            "an empty host in the host list; write host:port,host:port",
                        ))
                    } else {
                        Ok(format!("{node_scheme}://{auth}{host}{query}"))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            if before_query.is_empty() || before_query.contains(',') {
                return Err(bad(
                    "give one host (host:port); for several use redis+cluster:// or redlock://",
                ));
            }
            vec![format!("{node_scheme}://{before_query}{query}")]
        };
        Ok(RedisOptions {
            nodes,
            cluster,
            tls,
            ca_file,
            prefix,
            response_timeout,
            recheck,
            shown,
        })
    }
}

pub(super) fn client(options: &RedisOptions, node: &str) -> Result<redis::Client, LockError> {
    if options.tls {
        return tls_client(options, node);
    }
    redis::Client::open(node)
        .map_err(|e| LockError::invalid_option(format!("`{}`: {e}", options.shown)))
}

#[cfg(feature = "tls")]
fn read_ca(options: &RedisOptions) -> Result<Option<Vec<u8>>, LockError> {
    options
        .ca_file
        .as_ref()
        .map(|path| {
            std::fs::read(path).map_err(|e| {
                LockError::invalid_option(format!(
                    "`{}`: cannot read the CA file `{path}`: {e}",
                    options.shown
                ))
            })
        })
        .transpose()
}

/// rustls needs a process-wide crypto provider and panics without one. The
/// `redis` crate picks none, so dlock installs `ring` unless the application
/// already chose a provider (which then stays in force).
#[cfg(feature = "tls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(feature = "tls")]
fn tls_client(options: &RedisOptions, node: &str) -> Result<redis::Client, LockError> {
    ensure_crypto_provider();
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: read_ca(options)?,
    };
    redis::Client::build_with_tls(node, certs)
        .map_err(|e| LockError::invalid_option(format!("`{}`: {e}", options.shown)))
}

#[cfg(not(feature = "tls"))]
fn tls_client(options: &RedisOptions, _node: &str) -> Result<redis::Client, LockError> {
    Err(LockError::invalid_option(format!(
        "`{}` asks for TLS, but dlock was built without its `tls` feature; enable it in Cargo.toml",
        options.shown
    )))
}

#[cfg(feature = "tls")]
pub(super) fn tls_cluster(
    builder: redis::cluster::ClusterClientBuilder,
    options: &RedisOptions,
) -> Result<redis::cluster::ClusterClientBuilder, LockError> {
    ensure_crypto_provider();
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: read_ca(options)?,
    };
    Ok(builder.tls(redis::TlsMode::Secure).certs(certs))
}

#[cfg(not(feature = "tls"))]
pub(super) fn tls_cluster(
    _builder: redis::cluster::ClusterClientBuilder,
    options: &RedisOptions,
) -> Result<redis::cluster::ClusterClientBuilder, LockError> {
    Err(tls_client(options, "").unwrap_err())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn recheck_ms_sets_the_cap_and_zero_turns_it_off() {
        let o = RedisOptions::parse("redis://h:1/3?recheck_ms=250").unwrap();
        assert_eq!(o.recheck, Some(Duration::from_millis(250)));
        assert_eq!(o.nodes, ["redis://h:1/3"], "not passed on to the client");
        let o = RedisOptions::parse("redis+cluster://h1:1,h2:2?recheck_ms=0").unwrap();
        assert_eq!(o.recheck, None);
        assert_eq!(o.nodes, ["redis://h1:1", "redis://h2:2"]);
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
        ] {
            let msg = RedisOptions::parse(url).unwrap_err().to_string();
            assert!(msg.contains(says), "{url}: {msg}");
            assert!(!msg.contains("secret"), "{msg}");
        }
    }
}
