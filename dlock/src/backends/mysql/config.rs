//! The backend's configuration: a `mysql://` or `mysqls://` URL read with
//! the rules every backend shares (`url/parts.rs`: credentials up to the
//! last `@`; `url/options.rs`: every parameter named, "did you mean"), and
//! the `mysql_async` options built from it. Every error names the URL with
//! its password redacted.

use std::time::Duration;

use mysql_async::{Opts, OptsBuilder};

use super::names::MAX_PREFIX_CHARS;
use super::tls::SslMode;
use crate::backends::sessions::options::{SessionClock, SessionOptions};
use crate::url::{options, percent_decode};
use crate::LockError;

/// The server's port unless the URL gives one.
pub(super) const DEFAULT_PORT: u16 = 3306;
/// How MySQL counts a session's silence: `wait_timeout`, whole seconds.
const SESSION_CLOCK: SessionClock = SessionClock {
    min: Duration::from_secs(2),
    whole_seconds: true,
};

/// What a MySQL URL says.
#[derive(Clone)]
pub(super) struct Config {
    /// The options every session backend shares (`backends/sessions/options.rs`).
    pub(super) session: SessionOptions,
    /// The client's options (they hold the password).
    pub(super) opts: Opts,
    /// The database of dlock's table.
    pub(super) database: String,
    /// The namespace of lock names.
    pub(super) prefix: String,
    /// `?ssl-mode=` (or the scheme's default).
    pub(super) ssl_mode: SslMode,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("host", &self.opts.ip_or_hostname())
            .field("port", &self.opts.tcp_port())
            .field("user", &self.opts.user())
            .field("database", &self.database)
            .field("prefix", &self.prefix)
            .field("session", &self.session)
            .field("ssl_mode", &self.ssl_mode)
            .finish_non_exhaustive()
    }
}

/// Parses `mysql[s]://user[:password]@host[:port]/database[?param=value&...]`.
pub(super) fn parse(url: &str) -> Result<Config, LockError> {
    let shown = crate::url::redact(url);
    let bad = |why: String| LockError::invalid_option(format!("MySQL URL `{shown}`: {why}"));
    let parts = crate::url::parts::split(url).map_err(&bad)?;
    let mut ssl_mode = match parts.scheme {
        "mysql" => SslMode::Disabled,
        "mysqls" => SslMode::VerifyIdentity,
        _ => {
            return Err(bad(
                "not a MySQL URL; write `mysql://user:password@host:3306/database`".into(),
            ))
        }
    };
    let mut prefix = None;
    let mut session = SessionOptions::default();
    let mut ssl_ca = None;
    for pair in parts.query.split('&').filter(|p| !p.is_empty()) {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(raw).map_err(&bad)?;
        match name {
            "prefix" => prefix = Some(mysql_prefix(raw).map_err(&bad)?),
            "ssl-mode" => {
                ssl_mode = SslMode::parse(&value).ok_or_else(|| {
                    bad(format!(
                        "`ssl-mode={value}` is not one of DISABLED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY (PREFERRED, which falls back to plain text, is not offered: choose DISABLED or REQUIRED)"
                    ))
                })?
            }
            "ssl-ca" => {
                if value.is_empty() {
                    return Err(bad("`ssl-ca=` names no file".into()));
                }
                ssl_ca = Some(std::path::PathBuf::from(value));
            }
            other if session.take(other, &value, &SESSION_CLOCK).map_err(&bad)? => {}
            other => {
                return Err(bad(options::unknown(
                    other,
                    "MySQL",
                    options::MYSQL,
                    false,
                )))
            }
        }
    }
    // The parameters first: a wrong one is named whatever else is missing.
    let credentials = parts
        .credentials
        .clone()
        .ok_or_else(|| bad("no user; write `mysql://user:password@host:3306/database`".into()))?;
    if credentials.user.is_empty() {
        return Err(bad(
            "an empty user name; write `mysql://user:password@host:3306/database`".into(),
        ));
    }
    let (host, port) = host_port(parts.hosts).map_err(&bad)?;
    let database = percent_decode(parts.path.trim_start_matches('/')).map_err(&bad)?;
    if database.is_empty() || database.contains('/') {
        return Err(bad(
            "no database: dlock keeps its fence table in one; write `mysql://user:password@host:3306/database`".into(),
        ));
    }
    if database.chars().count() > 64 {
        return Err(bad(format!(
            "the database name `{database}` is longer than 64 characters"
        )));
    }

    if ssl_mode == SslMode::VerifyCa && ssl_ca.is_none() {
        return Err(bad(
            "`ssl-mode=VERIFY_CA` without `ssl-ca=<file>` would accept any certificate a public root vouches for, whatever host it names: give the CA that signed the server's certificate, or use VERIFY_IDENTITY".into(),
        ));
    }
    if ssl_mode == SslMode::Disabled && ssl_ca.is_some() {
        return Err(bad(
            "`ssl-ca=` without TLS would go unused: add `ssl-mode=VERIFY_IDENTITY` (or use `mysqls://`)".into(),
        ));
    }
    let ssl_opts = super::tls::ssl_opts(ssl_mode, ssl_ca).map_err(&bad)?;
    let third = (session.session_timeout / 3).max(Duration::from_secs(1));
    let opts = OptsBuilder::default()
        .ip_or_hostname(host)
        .tcp_port(port)
        .user(Some(credentials.user))
        .pass(credentials.password)
        .db_name(Some(database.clone()))
        // A session is what holds its locks: never moved to a Unix socket
        // behind the URL's back, never recycled by the client.
        .prefer_socket(false)
        .tcp_nodelay(true)
        .tcp_keepalive(session.tcp_keepalive.unwrap_or(Some(third)))
        .stmt_cache_size(0)
        .ssl_opts(ssl_opts);
    // Named locks are global to the server: the default keeps databases apart.
    let prefix = prefix.unwrap_or_else(|| super::names::default_prefix(&database));
    Ok(Config {
        opts: Opts::from(opts),
        database,
        prefix,
        session,
        ssl_mode,
    })
}

/// One `host[:port]`; an IPv6 address in brackets.
fn host_port(text: &str) -> Result<(String, u16), String> {
    if text.is_empty() {
        return Err("no host; write `mysql://user:password@host:3306/database`".into());
    }
    if text.contains(',') {
        return Err("several hosts: dlock's MySQL backend talks to one server (a lock lives in one server's memory); give one `host:port`".into());
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (address, after) = rest.split_once(']').ok_or_else(|| {
            format!("`{text}` opens an IPv6 address with `[` but never closes it")
        })?;
        (address.to_owned(), after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (text.to_owned(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("`{text}` has a port but no host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{p}` in `{text}` is not a port number (1-65535)"))?,
    };
    Ok((host, port))
}

/// `?prefix=`: the rule every backend shares, no `:` (the separator of
/// `<prefix>:<key>`: with `a:b` allowed, `?prefix=a` key `b:c` and
/// `?prefix=a:b` key `c` would be one lock), and at most
/// [`MAX_PREFIX_CHARS`] characters.
fn mysql_prefix(raw: &str) -> Result<String, String> {
    let prefix = crate::url::prefix::parse(raw)?;
    if prefix.contains(':') {
        return Err(format!(
            "`prefix={raw}` holds a `:`, the separator of `<prefix>:<key>` in lock names: write e.g. `prefix=billing-eu`"
        ));
    }
    if prefix.chars().count() > MAX_PREFIX_CHARS {
        return Err(format!(
            "`prefix={raw}` is longer than {MAX_PREFIX_CHARS} characters (a lock name, at most 64 characters on MySQL 8, holds the prefix and a hash of the key)"
        ));
    }
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_part() {
        let c = parse("mysql://app:p%40ss@db.local:3307/locks?prefix=jobs&sessions=2&session_timeout=10s&client_name=cron").unwrap();
        assert_eq!(c.opts.ip_or_hostname(), "db.local");
        assert_eq!(c.opts.tcp_port(), 3307);
        assert_eq!(c.opts.user(), Some("app"));
        assert_eq!(c.opts.pass(), Some("p@ss"));
        assert_eq!(c.database, "locks");
        assert_eq!((c.prefix.as_str(), c.session.sessions), ("jobs", 2));
        assert_eq!(c.session.session_timeout, Duration::from_secs(10));
        assert_eq!(c.session.client_name.as_deref(), Some("cron"));
        assert_eq!(c.ssl_mode, SslMode::Disabled);
        let c = parse("mysql://app@[::1]/db").unwrap();
        assert_eq!((c.opts.ip_or_hostname(), c.opts.tcp_port()), ("::1", 3306));
    }

    #[test]
    fn bad_urls_are_named_without_the_password() {
        for (url, says) in [
            ("mysql://app:Secret9@h/db?prefx=a", "did you mean `prefix`?"),
            ("mysql://app:Secret9@h", "no database"),
            ("mysql://h/db", "no user"),
            ("mysql://app:Secret9@h:0/db", "not a port"),
            ("mysql://app:Secret9@a,b/db", "one server"),
            ("mysql://app:Secret9@h/db?prefix=a:b", "separator"),
            ("mysql://app:Secret9@h/db?sessions=0", "from 1 to 64"),
            ("mysql://app:Secret9@h/db?session_timeout=1s", "between 2s"),
            ("mysql://app:Secret9@h/db?ssl-mode=PREFERRED", "not one of"),
            ("mysql://app:Secret9@h/db?ssl-mode=VERIFY_CA", "ssl-ca"),
            (
                "mysql://app:Secret9@h/db?sslmode=require",
                "did you mean `ssl-mode`?",
            ),
            (
                "mysql://app:Secret9@h/db?prefix=abcdefghijabcdefghijabcdefghijX",
                "longer than 30",
            ),
        ] {
            let err = parse(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("Secret9"), "{url}: {err}");
        }
    }
}
