//! The backend's configuration: parsing of `etcd://` and `etcds://` URLs,
//! and the TLS setup an `etcds://` URL asks for.
//!
//! Generic URL parsers reject the multi-host form (`etcd://h1:2379,h2:2379`),
//! so this is a small hand-written parser. Every error names the URL with its
//! password redacted.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::ConnectOptions;

use crate::url::{options, percent_decode};
use crate::LockError;

/// The port etcd clients use when the URL names none.
const DEFAULT_PORT: u16 = 2379;
/// The namespace of lock keys when `?prefix=` is not given.
pub(super) const DEFAULT_PREFIX: &str = "dlock";
/// How long one request may take before it counts as failed, unless `?timeout=` says otherwise.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// TCP keep-alive's idle time on every connection, unless `?tcp_keepalive=`
/// says otherwise (the same default as Redis's).
pub(super) const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(5);

/// What an etcd URL says.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Config {
    /// `http://host:port` or `https://host:port`, one per member.
    pub(super) endpoints: Vec<String>,
    /// `etcds://`: TLS to every member.
    pub(super) tls: bool,
    /// User name and password for etcd's auth.
    pub(super) user: Option<(String, String)>,
    /// The namespace of lock keys, without a trailing `/`.
    pub(super) prefix: String,
    /// A PEM file of the CA that signed the members' certificates (`?ca=`).
    pub(super) ca: Option<PathBuf>,
    /// The name the members' certificates are checked against (`?domain=`),
    /// when it is not the host in the URL.
    pub(super) domain: Option<String>,
    /// The bound on one request (`?timeout=`).
    pub(super) timeout: Duration,
    /// TCP keep-alive's idle time (`?tcp_keepalive=`; `None`: off).
    pub(super) tcp_keepalive: Option<Duration>,
    /// `?client_name=`: the value of each lock entry (see `crate::inspect`).
    pub(super) client_name: Option<String>,
    /// `?compaction=`: dlock compacts the history older than this (see
    /// `compaction.rs`); `None`: it does not.
    pub(super) compaction: Option<Duration>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("prefix", &self.prefix)
            .field("ca", &self.ca)
            .field("domain", &self.domain)
            .field("timeout", &self.timeout)
            .field("tcp_keepalive", &self.tcp_keepalive)
            .field("compaction", &self.compaction)
            .finish()
    }
}

/// Parses `etcd[s]://[user:password@]host[:port][,host[:port]...][/][?prefix=..&ca=..&domain=..&timeout=..&tcp_keepalive=..&compaction=..]`.
pub(super) fn parse(url: &str) -> Result<Config, LockError> {
    let shown = crate::url::redact(url);
    let bad = |why: String| LockError::invalid_option(format!("etcd URL `{shown}`: {why}"));

    let parts = crate::url::parts::split(url).map_err(&bad)?;
    let tls =
        match parts.scheme {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(bad(
                "not an etcd URL; write `etcd://host:2379[,host:2379...]` or `etcds://` for TLS"
                    .into(),
            )),
        };
    if !parts.path.is_empty() && parts.path != "/" {
        return Err(bad(format!(
            "the path `{}` means nothing to etcd; set the key namespace with `?prefix=...`",
            parts.path
        )));
    }
    let user = match parts.credentials {
        None => None,
        Some(credentials) => {
            let Some(password) = credentials.password else {
                return Err(bad(
                    "credentials need both parts: write `etcd://user:password@host:2379`".into(),
                ));
            };
            if credentials.user.is_empty() {
                return Err(bad("the user name is empty".into()));
            }
            Some((credentials.user, password))
        }
    };
    let scheme = if tls { "https" } else { "http" };
    let mut endpoints = Vec::new();
    for host in crate::url::parts::hosts(parts.hosts, DEFAULT_PORT).map_err(&bad)? {
        endpoints.push(format!("{scheme}://{host}"));
    }

    let mut config = Config {
        endpoints,
        tls,
        user,
        prefix: DEFAULT_PREFIX.to_owned(),
        ca: None,
        domain: None,
        timeout: DEFAULT_TIMEOUT,
        tcp_keepalive: Some(DEFAULT_TCP_KEEPALIVE),
        client_name: None,
        compaction: None,
    };
    for pair in parts.query.split('&').filter(|p| !p.is_empty()) {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(raw).map_err(&bad)?;
        match name {
            "prefix" => config.prefix = crate::url::prefix::parse(raw).map_err(&bad)?,
            "client_name" => {
                config.client_name = Some(
                    crate::backend::holder::check_client_name(&value)
                        .map_err(|e| bad(e.to_string()))?,
                )
            }
            "ca" if !tls => {
                return Err(bad(
                    "`ca=` only applies to TLS; write `etcds://` to connect with TLS".into(),
                ))
            }
            "ca" if value.is_empty() => return Err(bad("`ca=` needs a path to a PEM file".into())),
            "ca" => config.ca = Some(PathBuf::from(value)),
            "domain" if !tls => {
                return Err(bad(
                    "`domain=` only applies to TLS; write `etcds://` to connect with TLS".into(),
                ))
            }
            "domain" => config.domain = Some(value),
            "timeout" => config.timeout = options::duration(name, &value).map_err(&bad)?,
            "tcp_keepalive" => {
                config.tcp_keepalive = options::duration_or_off(name, &value).map_err(&bad)?
            }
            "compaction" => config.compaction = Some(compaction(&value).map_err(&bad)?),
            other => return Err(bad(options::unknown(other, "etcd", options::ETCD, false))),
        }
    }
    if tls && config.ca.is_none() {
        return Err(bad(
            "etcds:// needs the CA that signed the members' certificates: add `?ca=/path/to/ca.pem`".into(),
        ));
    }
    Ok(config)
}

/// `?compaction=`: how much history to keep, from a second to a week.
fn compaction(value: &str) -> Result<Duration, String> {
    let kept = options::duration("compaction", value)?;
    if kept < Duration::from_secs(1) || kept > Duration::from_secs(7 * 86_400) {
        return Err(format!(
            "`compaction={value}` must be between 1s and 7 days (the history dlock keeps when it \
             compacts etcd's; e.g. `compaction=1h`)"
        ));
    }
    Ok(kept)
}

#[cfg(feature = "tls")]
pub(super) fn tls_options(
    options: ConnectOptions,
    config: &Config,
    shown: &str,
) -> Result<ConnectOptions, LockError> {
    let mut tls = etcd_client::TlsOptions::new();
    if let Some(ca) = &config.ca {
        let pem = std::fs::read(ca).map_err(|e| {
            LockError::invalid_option(format!(
                "etcd URL `{shown}`: cannot read the CA file `{}`: {e}",
                ca.display()
            ))
        })?;
        tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
    }
    if let Some(domain) = &config.domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(options.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
pub(super) fn tls_options(
    _options: ConnectOptions,
    _config: &Config,
    shown: &str,
) -> Result<ConnectOptions, LockError> {
    Err(LockError::invalid_option(format!(
        "etcd URL `{shown}`: etcds:// needs TLS support; enable the `tls` feature of dlock"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_is_off_unless_asked_and_bounded() {
        assert_eq!(parse("etcd://127.0.0.1:2379").unwrap().compaction, None);
        let c = parse("etcd://127.0.0.1:2379?compaction=1h").unwrap();
        assert_eq!(c.compaction, Some(Duration::from_secs(3_600)));
        for (bad, says) in [
            ("0", "longer than zero"),
            ("500ms", "between 1s and 7 days"),
            ("8days", "between 1s and 7 days"),
            ("soon", "not a duration"),
        ] {
            let err = parse(&format!("etcd://u:pw@127.0.0.1:2379?compaction={bad}"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(says) && err.contains("compaction="),
                "{bad}: {err}"
            );
            assert!(!err.contains("pw"), "{err}");
        }
    }

    #[test]
    fn one_host_with_defaults() {
        let c = parse("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(c.prefix, "dlock");
        assert!(!c.tls && c.user.is_none());
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.tcp_keepalive, Some(DEFAULT_TCP_KEEPALIVE));
    }

    #[test]
    fn tcp_keepalive_is_spelled_as_on_redis() {
        let c = parse("etcd://h?tcp_keepalive=2s").unwrap();
        assert_eq!(c.tcp_keepalive, Some(Duration::from_secs(2)));
        assert_eq!(
            parse("etcd://h?tcp_keepalive=0").unwrap().tcp_keepalive,
            None
        );
        let e = parse("etcd://h?tcp_keepalive=often")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`tcp_keepalive=0` to turn it off"), "{e}");
    }

    #[test]
    fn many_hosts_default_port_options() {
        let c = parse("etcd://a,b:1,[::1]:3,[::1]/?prefix=locks&timeout=250ms").unwrap();
        assert_eq!(
            c.endpoints,
            [
                "http://a:2379",
                "http://b:1",
                "http://[::1]:3",
                "http://[::1]:2379"
            ]
        );
        assert_eq!(c.prefix, "locks");
        assert_eq!(c.timeout, Duration::from_millis(250));
    }

    #[test]
    fn credentials_tls_and_ca() {
        let c = parse("etcds://app:p%40ss@h:2379?ca=/etc/ca.pem&domain=etcd.local").unwrap();
        assert_eq!(c.user, Some(("app".into(), "p@ss".into())));
        assert_eq!(c.endpoints, ["https://h:2379"]);
        assert_eq!(c.ca, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(c.domain.as_deref(), Some("etcd.local"));
        assert!(
            !format!("{c:?}").contains("p@ss"),
            "Debug shows no password"
        );
    }

    #[test]
    fn bad_urls_name_the_problem_and_hide_the_password() {
        let cases = [
            ("etcd://", "no host"),
            ("etcd://h:0", "not a port"),
            ("etcd://h:x", "not a port"),
            ("etcd://h,,g", "empty host"),
            ("etcd://h/some/path", "path"),
            (
                "etcd://h?prefx=a",
                "unknown parameter `prefx`; did you mean `prefix`?",
            ),
            ("etcd://h?timeout=5", "is not a duration"),
            (
                "etcd://h?session_timeout=5s",
                "is a parameter of ZooKeeper URLs",
            ),
            ("etcd://h?prefix=", "empty"),
            ("etcd://h?prefix=app/x", "`/`"),
            ("etcd://h?prefix=dlock-semaphores", "-semaphores"),
            ("etcd://u:sec?ret@h", "percent-encode"),
            ("etcd://h?ca=/x", "only applies to TLS"),
            ("etcds://h", "?ca="),
            ("etcd://u:secret@h?timeout=soon", "timeout"),
            ("etcd://user@h", "both parts"),
            ("redis://h", "not an etcd URL"),
        ];
        for (url, expected) in cases {
            let msg = parse(url).unwrap_err().to_string();
            assert!(msg.contains(expected), "{url}: {msg}");
            assert!(!msg.contains("secret"), "{url}: {msg}");
        }
    }
}
