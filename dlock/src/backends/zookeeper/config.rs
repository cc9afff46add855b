//! Parsing of `zk://` URLs and escaping of keys into ZooKeeper node names.

use std::path::PathBuf;
use std::time::Duration;

use crate::LockError;

/// The ZooKeeper client port used when a host names none.
pub(super) const DEFAULT_PORT: u16 = 2181;

/// The session timeout asked of the server when the URL names none. A
/// crashed holder blocks others this long; leases last at most 11/20 of it
/// (16.5 s for the default lock's 30 s ttl; see the module docs). The
/// server may negotiate it into `[2, 20] × tickTime`.
pub(super) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection may stay silent before it is replaced (`?timeout=`):
/// the client pings after 3/8 of it without traffic, so a live server is
/// never silent that long. Without it `zookeeper-client` waits 2/5 of the
/// session timeout (12 s of the default 30 s), and a flow a NAT forgot cost
/// 13.5 s before the first lock; a stream whose bytes were discarded
/// mid-message (its frame lengths misread) is found silent once its ping
/// goes unanswered.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest session timeout a client can ask for: the protocol carries it
/// as a signed 32-bit count of milliseconds (about 24.8 days); a longer one
/// would wrap around into a negative or tiny request.
pub(super) const MAX_SESSION_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// The node under which every lock directory lives when the URL names no `prefix`.
pub(super) const DEFAULT_PREFIX: &str = "dlock";

/// The ACL dlock gives every node it creates, and demands of every
/// directory it queues in (`?acl=`; see `acl.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AclMode {
    /// `creator_read`, the default with credentials: the URL's identity may
    /// do everything, anyone may read (list and watch the queue).
    CreatorRead,
    /// `creator`: the URL's identity alone may do anything, reading included.
    Creator,
    /// `open`: anyone may do everything (`world:anyone:cdrwa`); the only
    /// choice without credentials.
    Open,
}

/// A parsed `zk://` URL.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Config {
    /// `host:port,host:port[/chroot]`, the connect string of `zookeeper-client`.
    pub(super) connect_string: String,
    /// `user:password` for the `digest` scheme, if the URL has userinfo.
    pub(super) digest: Option<String>,
    /// The requested session timeout.
    pub(super) session_timeout: Duration,
    /// `?timeout=`: a connection silent this long is replaced (the session
    /// moves to a new one); see [`DEFAULT_TIMEOUT`].
    pub(super) timeout: Duration,
    /// The first path component under the chroot (already a valid node name).
    pub(super) prefix: String,
    /// The ACL of the nodes dlock creates and demands of its directories.
    pub(super) acl: AclMode,
    /// `zks://`: TLS to every server, with these files.
    pub(super) tls: Option<TlsFiles>,
    /// `?client_name=`: the holder name in each lock node's data (see
    /// `crate::inspect`).
    pub(super) client_name: Option<String>,
}

/// The PEM files of a `zks://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TlsFiles {
    /// The CA that signed the servers' certificates (`?ca=`).
    pub(super) ca: PathBuf,
    /// The client certificate and its key (`?cert=`, `?key=`), for servers
    /// that ask for one (`ssl.clientAuth=need`).
    pub(super) identity: Option<(PathBuf, PathBuf)>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("connect_string", &self.connect_string)
            .field("digest", &self.digest.as_ref().map(|_| "***"))
            .field("session_timeout", &self.session_timeout)
            .field("timeout", &self.timeout)
            .field("prefix", &self.prefix)
            .field("acl", &self.acl)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Parses `zk[s]://[user:password@]host[:port][,host[:port]...][/chroot][?session_timeout=10s&prefix=dlock&acl=..&ca=..&cert=..&key=..]`.
pub(super) fn parse(url: &str) -> Result<Config, LockError> {
    let shown = crate::url::redact(url);
    let bad = |what: String| LockError::invalid_option(format!("`{shown}`: {what}"));
    let parts = crate::url::parts::split(url).map_err(&bad)?;
    let secure = match parts.scheme {
        "zk" => false,
        "zks" => true,
        _ => {
            return Err(bad(
            "not a ZooKeeper URL; write `zk://host:port[,host:port...][/chroot]` (or `zks://` for TLS)".into(),
        ));
        }
    };
    if secure && !cfg!(feature = "tls") {
        return Err(bad(
            "zks:// needs TLS support; enable the `tls` feature of dlock".into(),
        ));
    }
    let (hosts, chroot, query) = (parts.hosts, parts.path, parts.query);
    let digest = match parts.credentials {
        None => None,
        Some(credentials) => {
            let Some(pass) = credentials.password else {
                return Err(bad(
                    "digest auth needs `user:password@`; the password is missing".into(),
                ));
            };
            if credentials.user.is_empty() {
                return Err(bad("digest auth needs a user name before `:`".into()));
            }
            Some(format!("{}:{pass}", credentials.user))
        }
    };

    let servers: Vec<String> = crate::url::parts::hosts(hosts, DEFAULT_PORT)
        .map_err(&bad)?
        .iter()
        .map(ToString::to_string)
        .collect();

    let chroot = match chroot {
        "" | "/" => "",
        path => {
            validate_chroot(path).map_err(|e| bad(format!("chroot `{path}`: {e}")))?;
            path
        }
    };

    let mut session_timeout = DEFAULT_SESSION_TIMEOUT;
    let mut timeout = DEFAULT_TIMEOUT;
    let mut prefix = DEFAULT_PREFIX.to_owned();
    let mut acl = None;
    let mut client_name = None;
    let (mut ca, mut cert, mut key) = (None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "session_timeout" => {
                session_timeout = crate::url::options::duration(name, value).map_err(&bad)?;
                if session_timeout > MAX_SESSION_TIMEOUT {
                    return Err(bad(format!(
                        "`session_timeout={value}` is longer than ZooKeeper can carry ({} ms, about 24.8 days)",
                        MAX_SESSION_TIMEOUT.as_millis()
                    )));
                }
            }
            "timeout" => {
                timeout = crate::url::options::duration(name, value).map_err(&bad)?;
                if timeout < Duration::from_millis(100) {
                    return Err(bad(format!(
                        "`timeout={value}` is shorter than 100 ms: the client pings after 3/8 of it, and a live server would be taken for a silent one"
                    )));
                }
            }
            "prefix" => prefix = crate::url::prefix::parse(value).map_err(&bad)?,
            "client_name" => {
                client_name =
                    Some(crate::backend::holder::check_client_name(value).map_err(|e| bad(e.to_string()))?)
            }
            "acl" => {
                acl = Some(match value {
                    "creator_read" => AclMode::CreatorRead,
                    "creator" => AclMode::Creator,
                    "open" => AclMode::Open,
                    other => {
                        return Err(bad(format!(
                            "acl `{other}`: write `creator_read` (the default with credentials), `creator` or `open`"
                        )))
                    }
                });
            }
            "ca" | "cert" | "key" | "domain" if !secure => {
                return Err(bad(format!(
                    "`{name}=` only applies to TLS; write `zks://` to connect with TLS"
                )))
            }
            "ca" | "cert" | "key" => {
                let value =
                    crate::url::percent_decode(value).map_err(|e| bad(format!("`{name}=`: {e}")))?;
                if value.is_empty() {
                    return Err(bad(format!("`{name}=` needs the path to a PEM file")));
                }
                let slot = match name {
                    "ca" => &mut ca,
                    "cert" => &mut cert,
                    _ => &mut key,
                };
                *slot = Some(PathBuf::from(value));
            }
            // zookeeper-client checks a server's certificate against the
            // host name it connects to, and has no separate name to check.
            "domain" => {
                return Err(bad(
                    "`domain=` is not supported on zks://: each server's certificate is checked against the host name in the URL; write the hosts as their certificates name them".into(),
                ))
            }
            other => {
                return Err(bad(crate::url::options::unknown(
                    other,
                    "ZooKeeper",
                    crate::url::options::ZOOKEEPER,
                    false,
                )))
            }
        }
    }
    // Only an identity can own a node: without credentials, every client is
    // `world:anyone`, so the one ACL there is is the open one.
    let acl = match (acl, &digest) {
        (Some(AclMode::Open), _) | (None, None) => AclMode::Open,
        (None, Some(_)) => AclMode::CreatorRead,
        (Some(mode), Some(_)) => mode,
        (Some(_), None) => {
            return Err(bad(
                "`acl=creator_read` and `acl=creator` need credentials (`zk://user:password@host`): without them every client is `world:anyone`; use `acl=open` or add credentials"
                    .into(),
            ))
        }
    };

    let tls = if secure {
        let Some(ca) = ca else {
            return Err(bad(
                "zks:// needs the CA that signed the servers' certificates: add `?ca=/path/to/ca.pem`".into(),
            ));
        };
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(bad(
                    "a client certificate needs both `cert=` and `key=` (PEM files)".into(),
                ))
            }
        };
        Some(TlsFiles { ca, identity })
    } else {
        None
    };

    Ok(Config {
        connect_string: format!("{}{chroot}", servers.join(",")),
        digest,
        session_timeout,
        timeout,
        prefix,
        acl,
        tls,
        client_name,
    })
}

fn validate_chroot(path: &str) -> Result<(), String> {
    if path.ends_with('/') {
        return Err("must not end with `/`".into());
    }
    for part in path[1..].split('/') {
        if part.is_empty() {
            return Err("has an empty path component (`//`)".into());
        }
        if part == "." || part == ".." {
            return Err("must not contain `.` or `..` components".into());
        }
        if part.chars().any(forbidden_in_node_name) {
            return Err("contains a character ZooKeeper does not allow in node names".into());
        }
    }
    Ok(())
}

/// Characters ZooKeeper rejects in a path (`PathUtils.validatePath`): C0 and
/// C1 controls, DEL, the private-use block U+E000-U+F8FF, U+FFF0-U+FFFF, and
/// every character above U+FFFF: the Java server sees those as a UTF-16
/// surrogate pair, and rejects surrogates (U+D800-U+DFFF, which a Rust
/// string cannot hold itself) with "bad arguments".
fn forbidden_in_node_name(c: char) -> bool {
    c <= '\u{1f}'
        || ('\u{7f}'..='\u{9f}').contains(&c)
        || ('\u{e000}'..='\u{f8ff}').contains(&c)
        || c >= '\u{fff0}'
}

/// Maps a lock key to one node name that round-trips ([`unescape_key`]):
/// `%`, `/` and every character ZooKeeper forbids (characters above U+FFFF
/// included: `😀` becomes `%F0%9F%98%80`) become `%XX` per UTF-8 byte, and the names `.` and `..` (which ZooKeeper rejects) become `%2E`
/// and `%2E%2E`. Everything else, `:` and non-ASCII letters included, stays
/// as it is, so an operator recognises the key on the server.
pub(super) fn escape_key(key: &str) -> String {
    if key == "." || key == ".." {
        return "%2E".repeat(key.len());
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c == '%' || c == '/' || forbidden_in_node_name(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The inverse of [`escape_key`].
pub(super) fn unescape_key(name: &str) -> Option<String> {
    crate::url::percent_decode(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_chroot_and_options() {
        let c = parse("zk://a:1,b,[::1]:3/app/locks?session_timeout=10s&prefix=mine").unwrap();
        assert_eq!(c.connect_string, "a:1,b:2181,[::1]:3/app/locks");
        assert_eq!(c.session_timeout, Duration::from_secs(10));
        assert_eq!(c.prefix, "mine");
        assert_eq!(c.digest, None);
        let c = parse("zk://127.0.0.1:2181").unwrap();
        assert_eq!(c.connect_string, "127.0.0.1:2181");
        assert_eq!(c.session_timeout, DEFAULT_SESSION_TIMEOUT);
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.prefix, "dlock");
        let c = parse("zk://h:1?timeout=2s").unwrap();
        assert_eq!(c.timeout, Duration::from_secs(2));
        // Longer than the session allows: `zookeeper-client` keeps its own.
        let c = parse("zk://h:1?timeout=30days").unwrap();
        assert_eq!(c.timeout, Duration::from_secs(30 * 86_400));
        let c = parse("zk://h:1/?session_timeout=1500ms").unwrap();
        assert_eq!(c.connect_string, "h:1");
        assert_eq!(c.session_timeout, Duration::from_millis(1500));
    }

    #[test]
    fn the_acl_defaults_to_creator_read_with_credentials_and_open_without() {
        assert_eq!(parse("zk://h:1").unwrap().acl, AclMode::Open);
        assert_eq!(parse("zk://h:1?acl=open").unwrap().acl, AclMode::Open);
        assert_eq!(parse("zk://a:b@h:1").unwrap().acl, AclMode::CreatorRead);
        assert_eq!(
            parse("zk://a:b@h:1?acl=creator").unwrap().acl,
            AclMode::Creator
        );
        assert_eq!(parse("zk://a:b@h:1?acl=open").unwrap().acl, AclMode::Open);
    }

    #[cfg(feature = "tls")]
    #[test]
    fn zks_takes_a_ca_and_a_client_certificate() {
        let c = parse("zks://app:pw@h:1?ca=/etc/ca.pem&cert=/c.pem&key=/k%20ey.pem").unwrap();
        let tls = c.tls.unwrap();
        assert_eq!(tls.ca, PathBuf::from("/etc/ca.pem"));
        assert_eq!(
            tls.identity,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k ey.pem")))
        );
        assert_eq!(parse("zk://h:1").unwrap().tls, None);
        for (url, says) in [
            ("zks://h:1", "needs the CA"),
            ("zks://h:1?ca=", "path to a PEM file"),
            (
                "zks://h:1?ca=/ca.pem&cert=/c.pem",
                "both `cert=` and `key=`",
            ),
            (
                "zks://h:1?ca=/ca.pem&domain=zk.local",
                "not supported on zks://",
            ),
        ] {
            let err = parse(url).unwrap_err();
            assert!(matches!(err, LockError::InvalidOption { .. }), "{url}");
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn zks_without_the_tls_feature_says_so() {
        let err = parse("zks://h:1?ca=/ca.pem").unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(err.to_string().contains("`tls` feature"), "{err}");
    }

    #[test]
    fn digest_auth_is_decoded_and_never_shown() {
        let c = parse("zk://app:p%40ss@h:1").unwrap();
        assert_eq!(c.digest.as_deref(), Some("app:p@ss"));
        assert!(!format!("{c:?}").contains("p@ss"));
        let err = parse("zk://app:hunter2@h:0").unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("app:***@h:0"), "{err}");
    }

    #[test]
    fn rejects_bad_urls_naming_the_problem() {
        for (url, says) in [
            ("redis://h:1", "not a ZooKeeper URL"),
            ("zk://", "no host"),
            ("zk://a,,b", "empty host"),
            ("zk://h:x", "not a port"),
            ("zk://h:1/a//b", "empty path component"),
            ("zk://h:1/a/", "must not end"),
            ("zk://h:1?session_timeout=10x", "is not a duration"),
            ("zk://h:1?session_timeout=1500", "is not a duration"),
            ("zk://h:1?session_timeout=0s", "zero"),
            (
                "zk://h:1?session_timeout=2147483648ms",
                "longer than ZooKeeper can carry",
            ),
            ("zk://h:1?session_timeout=30days", "longer than"),
            ("zk://h:1?timeout=0s", "zero"),
            ("zk://h:1?timeout=50ms", "shorter than 100 ms"),
            ("zk://h:1?timeout=fast", "not a duration"),
            (
                "zk://h:1?session_timeout=99999999999999999999m",
                "not a duration",
            ),
            ("zk://h:1?prefix=a/b", "`/`"),
            ("zk://h:1?prefix=zookeeper", "keep for themselves"),
            ("zk://h:1?prefix=dlock-rw", "-rw"),
            ("zk://u:a/b@h:1", "percent-encode"),
            ("zk://h:1?colour=red", "unknown parameter `colour`"),
            ("zk://h:1?prefx=a", "did you mean `prefix`?"),
            ("zk://h:1?timeout_ms=5", "is a parameter of Redis URLs"),
            ("zk://user@h:1", "password is missing"),
            ("zk://h:1?acl=creator", "need credentials"),
            ("zk://h:1?ca=/ca.pem", "only applies to TLS"),
            ("zk://h:1?cert=/c.pem", "only applies to TLS"),
            ("zk://h:1?acl=creator_read", "need credentials"),
            ("zk://a:b@h:1?acl=world", "acl `world`"),
        ] {
            let err = parse(url).unwrap_err();
            assert!(matches!(err, LockError::InvalidOption { .. }), "{url}");
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn keys_escape_into_one_node_name_and_round_trip() {
        for key in [
            "order:42",
            "a/b/c",
            "100%",
            ".",
            "..",
            "...",
            "заказ/7",
            "priv\u{e000}ate",
            "end\u{fff5}",
            "%2F",
            "user:😀",
            "\u{10000}\u{10ffff}",
        ] {
            let name = escape_key(key);
            assert!(!name.contains('/'), "{key:?} -> {name}");
            assert!(name != "." && name != "..", "{key:?} -> {name}");
            assert!(
                !name.chars().any(forbidden_in_node_name),
                "{key:?} -> {name}"
            );
            assert_eq!(unescape_key(&name).as_deref(), Some(key), "{name}");
        }
        assert_eq!(escape_key("order:42"), "order:42");
        assert_eq!(escape_key("a/b"), "a%2Fb");
        // Keys that worked before astral characters were escaped keep their
        // names; those are escaped per UTF-8 byte.
        assert_eq!(escape_key("заказ é 日本"), "заказ é 日本");
        assert_eq!(escape_key("user:😀"), "user:%F0%9F%98%80");
    }
}
