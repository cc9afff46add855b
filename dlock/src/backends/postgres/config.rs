//! The backend's configuration: a `postgres://` or `postgresql://` URL cut
//! into dlock's own parameters and the libpq connection string that
//! `tokio_postgres::Config` reads (hosts, socket directories, ports, user,
//! database, `sslmode`, ...). Every error names the URL with its password
//! redacted, and never quotes tokio-postgres's reading of it.

use std::str::FromStr;
use std::time::Duration;

use crate::url::{options, percent_decode};
use crate::LockError;

/// The namespace of lock keys when `?prefix=` is not given.
pub(crate) const DEFAULT_PREFIX: &str = "dlock";
/// How many sessions (connections) hold locks, unless `?sessions=` says otherwise.
pub(super) const DEFAULT_SESSIONS: usize = 4;
/// The most sessions one backend opens.
pub(super) const MAX_SESSIONS: usize = 64;
/// The bound on one request and on connecting, unless `?timeout=` says otherwise.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server lets a lock-holding session be silent before it
/// ends it (`idle_session_timeout`), unless `?session_timeout=` says otherwise.
pub(super) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);
/// The shortest `?session_timeout=`: the pings every third of it must fit.
const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(300);
/// The longest `?session_timeout=`: a day.
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(86_400);
/// The schema of the fence table, unless `?schema=` says otherwise.
pub(super) const DEFAULT_SCHEMA: &str = "public";

/// The libpq parameters tokio-postgres reads, passed to it as written.
const LIBPQ: &[&str] = &[
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// What a PostgreSQL URL says.
#[derive(Clone)]
pub(super) struct Config {
    /// The libpq part, for tokio-postgres (it holds the password).
    pub(super) pg: tokio_postgres::Config,
    /// The namespace of lock keys.
    pub(super) prefix: String,
    /// The schema of `dlock_fences`.
    pub(super) schema: String,
    /// How many sessions hold locks.
    pub(super) sessions: usize,
    /// The bound on one request.
    pub(super) timeout: Duration,
    /// The server's `idle_session_timeout` on lock-holding sessions.
    pub(super) session_timeout: Duration,
    /// `?client_name=`.
    pub(super) client_name: Option<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("hosts", &self.pg.get_hosts())
            .field("ports", &self.pg.get_ports())
            .field("user", &self.pg.get_user())
            .field("dbname", &self.pg.get_dbname())
            .field("prefix", &self.prefix)
            .field("schema", &self.schema)
            .field("sessions", &self.sessions)
            .field("timeout", &self.timeout)
            .field("session_timeout", &self.session_timeout)
            .finish_non_exhaustive()
    }
}

/// `url` as errors and `describe()` show it: any password hidden, and a
/// lone name before the `@` too (other backends read it as a password;
/// showing too little is the safe side).
pub(super) fn shown(url: &str) -> String {
    crate::url::redact(url)
}

/// Parses `postgres[ql]://[user[:password]@][host][:port][,host[:port]...][/dbname][?param=value&...]`.
pub(super) fn parse(url: &str) -> Result<Config, LockError> {
    let shown = shown(url);
    let bad = |why: String| LockError::invalid_option(format!("PostgreSQL URL `{shown}`: {why}"));
    // The credentials rule every backend shares (a raw `/`, `?` or `#` in a
    // password is refused before anything reads the URL).
    let parts = crate::url::parts::split(url).map_err(&bad)?;
    if !matches!(parts.scheme, "postgres" | "postgresql") {
        return Err(bad(
            "not a PostgreSQL URL; write `postgres://user@host:5432/dbname`".into(),
        ));
    }
    let before_query = &url[..url.len() - parts.query.len()];
    let before_query = before_query.strip_suffix('?').unwrap_or(before_query);

    let mut config = Config {
        pg: tokio_postgres::Config::new(),
        prefix: DEFAULT_PREFIX.to_owned(),
        schema: DEFAULT_SCHEMA.to_owned(),
        sessions: DEFAULT_SESSIONS,
        timeout: DEFAULT_TIMEOUT,
        session_timeout: DEFAULT_SESSION_TIMEOUT,
        client_name: None,
    };
    let known: Vec<&str> = options::POSTGRES.iter().chain(LIBPQ).copied().collect();
    let mut libpq = Vec::new();
    let mut after_password = false;
    for pair in parts.query.split('&').filter(|p| !p.is_empty()) {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        if LIBPQ.contains(&name) {
            if name == "sslmode" && !matches!(raw, "disable" | "prefer") {
                return Err(bad(format!(
                    "`sslmode={raw}`: TLS to PostgreSQL is not yet supported by dlock; use `sslmode=disable` or `prefer` (which connects without TLS), or reach the server over a trusted network or a Unix socket (`?host=/var/run/postgresql`)"
                )));
            }
            after_password |= name == "password";
            libpq.push(pair);
            continue;
        }
        if after_password {
            return Err(bad(options::unknown(name, "PostgreSQL", &known, true)));
        }
        let value = percent_decode(raw).map_err(&bad)?;
        match name {
            "prefix" => config.prefix = crate::url::prefix::parse(raw).map_err(&bad)?,
            "client_name" => {
                config.client_name = Some(
                    crate::inspect::check_client_name(&value).map_err(|e| bad(e.to_string()))?,
                )
            }
            "timeout" => config.timeout = options::duration(name, &value).map_err(&bad)?,
            "session_timeout" => {
                let d = options::duration(name, &value).map_err(&bad)?;
                if !(MIN_SESSION_TIMEOUT..=MAX_SESSION_TIMEOUT).contains(&d) {
                    return Err(bad(format!(
                        "`session_timeout={value}` must be between {MIN_SESSION_TIMEOUT:?} and one day"
                    )));
                }
                config.session_timeout = d;
            }
            "sessions" => {
                config.sessions = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_SESSIONS).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "`sessions={value}` must be a number from 1 to {MAX_SESSIONS}"
                        ))
                    })?
            }
            "schema" => config.schema = schema(&value).map_err(&bad)?,
            other => return Err(bad(options::unknown(other, "PostgreSQL", &known, false))),
        }
    }
    let libpq_url = if libpq.is_empty() {
        before_query.to_owned()
    } else {
        format!("{before_query}?{}", libpq.join("&"))
    };
    // tokio-postgres's own message may quote a value; only its kind is shown.
    config.pg = tokio_postgres::Config::from_str(&libpq_url).map_err(|_| {
        bad("not a libpq connection URL (check the hosts, ports, the database name and the libpq parameters' values)".into())
    })?;
    if config.pg.get_hosts().is_empty() {
        return Err(bad(
            "no host; write `postgres://user@host:5432/dbname`, or `?host=/var/run/postgresql` for a Unix socket directory".into(),
        ));
    }
    if config.pg.get_user().is_none() {
        return Err(bad(
            "no user; write `postgres://user@host/dbname` or `?user=name`".into(),
        ));
    }
    if config.pg.get_connect_timeout().is_none() {
        config.pg.connect_timeout(config.timeout);
    }
    if config.pg.get_application_name().is_none() {
        config.pg.application_name("dlock");
    }
    Ok(config)
}

/// Checks a `?schema=` name: a plain SQL identifier (written quoted in
/// every statement, so the case is kept).
fn schema(name: &str) -> Result<String, String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || name.len() > 63 {
        return Err(format!(
            "`schema={name}` is not a plain identifier (ASCII letters, digits and `_`, not starting with a digit, at most 63 bytes)"
        ));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        parse(url).unwrap_err().to_string()
    }

    #[test]
    fn reads_libpq_urls_and_dlock_parameters() {
        let c = parse("postgres://app:pw@db1:5433,db2/orders?sslmode=disable&sessions=2&schema=locks&prefix=billing&session_timeout=10s").unwrap();
        assert_eq!(c.pg.get_user(), Some("app"));
        assert_eq!(c.pg.get_dbname(), Some("orders"));
        assert_eq!(c.pg.get_ports(), &[5433, 5432]);
        assert_eq!(c.pg.get_hosts().len(), 2);
        assert_eq!(c.sessions, 2);
        assert_eq!(c.schema, "locks");
        assert_eq!(c.prefix, "billing");
        assert_eq!(c.session_timeout, Duration::from_secs(10));
        assert_eq!(c.pg.get_connect_timeout(), Some(&DEFAULT_TIMEOUT));
        let socket = parse("postgresql://app@/db?host=/var/run/postgresql&port=5444").unwrap();
        assert_eq!(socket.pg.get_ports(), &[5444]);
        assert!(!format!("{c:?}").contains("pw"));
        assert_eq!(shown("postgres://app@h/db"), "postgres://***@h/db");
        assert_eq!(shown("postgres://app:pw@h/db"), "postgres://app:***@h/db");
        assert_eq!(
            shown("postgres://app@h/db?password=pw&x=1"),
            "postgres://***@h/db?password=***"
        );
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        assert!(err("postgres://u@h/db?sesions=2").contains("did you mean `sessions`?"));
        assert!(err("postgres://u@h/db?sslmode=require")
            .contains("TLS to PostgreSQL is not yet supported"));
        assert!(err("postgres://u@h/db?sessions=0").contains("from 1 to 64"));
        assert!(err("postgres://u@h/db?schema=a;drop").contains("plain identifier"));
        assert!(err("postgres://u@h/db?acl=open").contains("ZooKeeper"));
        assert!(err("postgres://h/db").contains("no user"));
        let e = err("postgres://u:hunter2@h:notaport/db");
        assert!(e.contains("not a libpq connection URL"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = err("postgres://u@h/db?password=hunter2&bogus=1");
        assert!(!e.contains("hunter2") && !e.contains("bogus"), "{e}");
    }
}
