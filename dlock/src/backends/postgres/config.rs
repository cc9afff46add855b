//! The backend's configuration: a `postgres://` or `postgresql://` URL cut
//! into dlock's own parameters and the libpq connection string that
//! `tokio_postgres::Config` reads (hosts, socket directories, ports, user,
//! database, ...), plus the TLS parameters dlock reads itself (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`). Every error names the URL with its
//! password redacted, and never quotes tokio-postgres's reading of it.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::tls_params::{Root, SslMode, TlsParams};
use crate::backends::sessions::options::{SessionClock, SessionOptions};
use crate::url::{options, percent_decode};
use crate::LockError;

/// The namespace of lock keys when `?prefix=` is not given.
pub(crate) const DEFAULT_PREFIX: &str = "dlock";
/// How PostgreSQL counts a session's silence: `idle_session_timeout`, in
/// ms; the shortest must leave room for the pings every third of it.
const SESSION_CLOCK: SessionClock = SessionClock {
    min: Duration::from_millis(300),
    whole_seconds: false,
};
/// The schema of the fence table, unless `?schema=` says otherwise.
pub(super) const DEFAULT_SCHEMA: &str = "public";

/// The libpq parameters tokio-postgres reads, passed to it as written.
const LIBPQ: &[&str] = &[
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
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

/// libpq's TLS parameters, read by dlock (tokio-postgres knows `sslmode`
/// but not libpq's `verify-ca` and `verify-full`, nor the files).
const LIBPQ_TLS: &[&str] = &["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// What a PostgreSQL URL says.
#[derive(Clone)]
pub(super) struct Config {
    /// The options every session backend shares (`backends/sessions/options.rs`).
    pub(super) session: SessionOptions,
    /// The libpq part, for tokio-postgres (it holds the password).
    pub(super) pg: tokio_postgres::Config,
    /// The namespace of lock keys.
    pub(super) prefix: String,
    /// The schema of `dlock_fences`.
    pub(super) schema: String,
    /// Whether the URL set TCP keep-alive itself (`?tcp_keepalive=`, or
    /// libpq's `keepalives`/`keepalives_idle`): then `session::connect`
    /// keeps it as written instead of dlock's default.
    pub(super) keepalive_given: bool,
    /// Whether the URL set libpq's `tcp_user_timeout` (kept as written).
    pub(super) user_timeout_given: bool,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`.
    pub(super) tls: TlsParams,
    /// The TLS configuration every connection uses (built at `parse`, so a
    /// bad file is an error of `connect`).
    #[cfg(feature = "tls")]
    pub(super) connector: super::tls::Connector,
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
            .field("session", &self.session)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// Parses `postgres[ql]://[user[:password]@][host][:port][,host[:port]...][/dbname][?param=value&...]`.
pub(super) fn parse(url: &str) -> Result<Config, LockError> {
    let shown = crate::url::redact(url);
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

    let mut prefix = DEFAULT_PREFIX.to_owned();
    let mut schema_name = DEFAULT_SCHEMA.to_owned();
    let mut session = SessionOptions::default();
    let mut tls = TlsParams {
        mode: SslMode::Prefer,
        root: None,
        identity: None,
    };
    let (mut sslcert, mut sslkey, mut mode_given) = (None, None, false);
    let known: Vec<&str> = options::POSTGRES
        .iter()
        .chain(LIBPQ)
        .chain(LIBPQ_TLS)
        .copied()
        .collect();
    let mut libpq = Vec::new();
    let mut after_password = false;
    for pair in parts.query.split('&').filter(|p| !p.is_empty()) {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        if LIBPQ.contains(&name) {
            after_password |= name == "password";
            libpq.push(pair);
            continue;
        }
        if after_password && !LIBPQ_TLS.contains(&name) {
            return Err(bad(options::unknown(name, "PostgreSQL", &known, true)));
        }
        let value = percent_decode(raw).map_err(&bad)?;
        match name {
            "sslmode" => {
                mode_given = true;
                tls.mode = SslMode::parse(&value).ok_or_else(|| {
                    bad(format!(
                        "`sslmode={value}` is not one of disable, allow, prefer, require, verify-ca, verify-full"
                    ))
                })?
            }
            "sslrootcert" => {
                tls.root = Some(match value.as_str() {
                    "" => return Err(bad("`sslrootcert=` names no file".into())),
                    "system" => Root::System,
                    path => Root::File(PathBuf::from(path)),
                })
            }
            "sslcert" => sslcert = Some(file(name, &value).map_err(&bad)?),
            "sslkey" => sslkey = Some(file(name, &value).map_err(&bad)?),
            "prefix" => prefix = postgres_prefix(raw).map_err(&bad)?,
            "schema" => schema_name = schema(&value).map_err(&bad)?,
            other if session.take(other, &value, &SESSION_CLOCK).map_err(&bad)? => {}
            other => return Err(bad(options::unknown(other, "PostgreSQL", &known, false))),
        }
    }
    let libpq_url = if libpq.is_empty() {
        before_query.to_owned()
    } else {
        format!("{before_query}?{}", libpq.join("&"))
    };
    // tokio-postgres's own message may quote a value; only its kind is shown.
    let mut pg = tokio_postgres::Config::from_str(&libpq_url).map_err(|_| {
        bad("not a libpq connection URL (check the hosts, ports, the database name and the libpq parameters' values)".into())
    })?;
    tls.identity = match (sslcert, sslkey) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((cert, key)),
        (Some(_), None) => {
            return Err(bad(
                "`sslcert=` without `sslkey=`: give the client certificate's key too".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(bad(
                "`sslkey=` without `sslcert=`: give the client certificate too".into(),
            ))
        }
    };
    // libpq 16's rule: the system roots are trusted for host names only.
    if tls.root == Some(Root::System) {
        if !mode_given {
            tls.mode = SslMode::VerifyFull;
        } else if tls.mode != SslMode::VerifyFull {
            return Err(bad(format!(
                "`sslrootcert=system` needs `sslmode=verify-full` (as in libpq): the system's roots vouch for host names, not for a chain alone; got `sslmode={}`",
                tls.mode.name()
            )));
        }
    }
    // The public roots vouch for host names: a chain to them alone proves
    // nothing about who the server is (libpq 16 refuses the same for
    // `sslrootcert=system`).
    if tls.mode == SslMode::VerifyCa && tls.root.is_none() {
        return Err(bad(
            "`sslmode=verify-ca` without `sslrootcert=<file>` would accept any certificate that Mozilla's public roots vouch for, whatever host it names: give the CA that signed the server's certificate (`sslrootcert=/path/to/ca.pem`), or use `sslmode=verify-full`, which checks the host name too".into(),
        ));
    }
    // No parameter goes unused (libpq would ignore these).
    if tls.mode == SslMode::Disable && (tls.root.is_some() || tls.identity.is_some()) {
        return Err(bad(
            "`sslmode=disable` with `sslrootcert`, `sslcert` or `sslkey`: without TLS the files would go unused; remove them, or choose a TLS mode (`sslmode=verify-full`)".into(),
        ));
    }
    check_tls_feature(&tls).map_err(&bad)?;
    pg.ssl_mode(tls.mode.wire());
    let given = |name: &str| {
        libpq
            .iter()
            .any(|pair| pair.split('=').next() == Some(name))
    };
    let libpq_keepalive = given("keepalives") || given("keepalives_idle");
    if let Some(idle) = session.tcp_keepalive {
        if libpq_keepalive {
            return Err(bad(
                "`tcp_keepalive=` and libpq's `keepalives`/`keepalives_idle` set the same thing: keep one".into(),
            ));
        }
        match idle {
            Some(idle) => pg.keepalives(true).keepalives_idle(idle),
            None => pg.keepalives(false),
        };
    }
    let keepalive_given = libpq_keepalive || session.tcp_keepalive.is_some();
    let user_timeout_given = given("tcp_user_timeout");
    let mut config = Config {
        #[cfg(feature = "tls")]
        connector: super::tls::connector(&tls, &shown)?,
        pg,
        prefix,
        schema: schema_name,
        session,
        keepalive_given,
        user_timeout_given,
        tls,
    };
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
        config.pg.connect_timeout(config.session.timeout);
    }
    if config.pg.get_application_name().is_none() {
        config.pg.application_name("dlock");
    }
    Ok(config)
}

/// `?prefix=`: the rule every backend shares, and no `:`. The lock name
/// hashed into the advisory key is `<prefix>:<key>` and keys may hold `:`,
/// so with `a:b` allowed, `?prefix=a` key `b:c` and `?prefix=a:b` key `c`
/// would be one lock. Refusing `:` keeps every valid prefix's numbers as
/// they always were (`advisory_key_in`), where a new encoding would have
/// split the locks of clients before and after an upgrade.
fn postgres_prefix(raw: &str) -> Result<String, String> {
    let prefix = crate::url::prefix::parse(raw)?;
    if prefix.contains(':') {
        return Err(format!(
            "`prefix={prefix}` contains `:`, the separator of the lock name `<prefix>:<key>` on PostgreSQL (prefix `a` with key `b:c` would be the lock of prefix `a:b` with key `c`); use another character, e.g. `prefix={}`",
            prefix.replace(':', "-")
        ));
    }
    Ok(prefix)
}

/// A file parameter's path (`sslcert`, `sslkey`).
fn file(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err(format!("`{name}=` names no file"));
    }
    Ok(PathBuf::from(value))
}

/// Without the `tls` feature, only plain connections: a URL that asks for
/// TLS (or gives its files) is refused, naming the feature.
fn check_tls_feature(tls: &TlsParams) -> Result<(), String> {
    if cfg!(feature = "tls") {
        return Ok(());
    }
    let asks = match (tls.mode, &tls.root, &tls.identity) {
        (SslMode::Disable, _, _) => return Ok(()),
        (SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull, _, _) => {
            format!("sslmode={}", tls.mode.name())
        }
        (_, Some(_), _) => "sslrootcert".to_owned(),
        (_, _, Some(_)) => "sslcert".to_owned(),
        _ => return Ok(()),
    };
    Err(format!(
        "`{asks}` asks for TLS, but dlock was built without its `tls` feature: enable it with `features = [\"postgres\", \"tls\"]` in Cargo.toml (without it, `sslmode=disable` or `prefer` connect without TLS)"
    ))
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

    /// dlock's keep-alive and user timeout unless the URL set its own,
    /// in dlock's spelling (`tcp_keepalive=`) or libpq's.
    #[test]
    fn keep_alive_and_user_timeout_are_the_urls_when_given() {
        use super::super::session::client_config;
        let c = parse("postgres://u@h/db?session_timeout=9s").unwrap();
        let pg = client_config(&c);
        assert!(pg.get_keepalives());
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(3));
        assert_eq!(pg.get_tcp_user_timeout(), Some(&Duration::from_secs(9)));
        let pg = client_config(&parse("postgres://u@h/db?tcp_keepalive=20s").unwrap());
        assert!(pg.get_keepalives());
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(20));
        let pg = client_config(&parse("postgres://u@h/db?tcp_keepalive=0").unwrap());
        assert!(!pg.get_keepalives());
        let pg = client_config(&parse("postgres://u@h/db?keepalives_idle=40").unwrap());
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(40));
        let pg = client_config(&parse("postgres://u@h/db?tcp_user_timeout=2").unwrap());
        assert_eq!(pg.get_tcp_user_timeout(), Some(&Duration::from_secs(2)));
        let e = err("postgres://u@h/db?tcp_keepalive=5s&keepalives_idle=5");
        assert!(e.contains("keep one"), "{e}");
    }

    #[test]
    fn reads_libpq_urls_and_dlock_parameters() {
        let c = parse("postgres://app:pw@db1:5433,db2/orders?sslmode=disable&sessions=2&schema=locks&prefix=billing&session_timeout=10s").unwrap();
        assert_eq!(c.pg.get_user(), Some("app"));
        assert_eq!(c.pg.get_dbname(), Some("orders"));
        assert_eq!(c.pg.get_ports(), &[5433, 5432]);
        assert_eq!(c.pg.get_hosts().len(), 2);
        assert_eq!(c.session.sessions, 2);
        assert_eq!(c.schema, "locks");
        assert_eq!(c.prefix, "billing");
        assert_eq!(
            c.session.fence_retention,
            crate::backends::fence_retention::DEFAULT_FENCE_RETENTION
        );
        assert_eq!(c.session.session_timeout, Duration::from_secs(10));
        let retained = parse("postgres://u@h/db?fence_retention=1h").unwrap();
        assert_eq!(retained.session.fence_retention, Duration::from_secs(3600));
        assert_eq!(
            c.pg.get_connect_timeout(),
            Some(&crate::backends::sessions::options::DEFAULT_TIMEOUT)
        );
        let socket = parse("postgresql://app@/db?host=/var/run/postgresql&port=5444").unwrap();
        assert_eq!(socket.pg.get_ports(), &[5444]);
        assert!(!format!("{c:?}").contains("pw"));
        assert_eq!(
            crate::url::redact("postgres://app@h/db"),
            "postgres://***@h/db"
        );
        assert_eq!(
            crate::url::redact("postgres://app:pw@h/db"),
            "postgres://app:***@h/db"
        );
        assert_eq!(
            crate::url::redact("postgres://app@h/db?password=pw&x=1"),
            "postgres://***@h/db?password=***"
        );
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        assert!(err("postgres://u@h/db?sesions=2").contains("did you mean `sessions`?"));
        assert!(err("postgres://u@h/db?sslmode=requir").contains("not one of disable"));
        assert!(err("postgres://u@h/db?sessions=0").contains("from 1 to 64"));
        assert!(err("postgres://u@h/db?schema=a;drop").contains("plain identifier"));
        let e = err("postgres://u@h/db?prefix=a:b");
        assert!(
            e.contains("contains `:`") && e.contains("prefix=a-b"),
            "{e}"
        );
        assert!(err("postgres://u@h/db?prefix=a%3Ab").contains("contains `:`"));
        assert!(err("postgres://u@h/db?fence_retention=0s").contains("longer than zero"));
        assert!(err("postgres://u@h/db?fence_retention=400d").contains("365 days"));
        let e = err("postgres://u@h/db?sslmode=verify-ca");
        assert!(e.contains("without `sslrootcert=<file>`"), "{e}");
        assert!(err("postgres://u@h/db?acl=open").contains("ZooKeeper"));
        assert!(err("postgres://h/db").contains("no user"));
        let e = err("postgres://u:hunter2@h:notaport/db");
        assert!(e.contains("not a libpq connection URL"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = err("postgres://u@h/db?password=hunter2&bogus=1");
        assert!(!e.contains("hunter2") && !e.contains("bogus"), "{e}");
    }

    #[test]
    fn reads_libpq_tls_parameters() {
        use tokio_postgres::config::SslMode as Wire;
        // libpq's default is `prefer`, tried with TLS only when built with it.
        let c = parse("postgres://u@h/db").unwrap();
        assert_eq!(c.tls.mode, SslMode::Prefer);
        assert_eq!(c.pg.get_ssl_mode(), Wire::Prefer);
        for (mode, ours, wire) in [
            ("disable", SslMode::Disable, Wire::Disable),
            ("allow", SslMode::Prefer, Wire::Prefer),
            ("prefer", SslMode::Prefer, Wire::Prefer),
        ] {
            let c = parse(&format!("postgres://u@h/db?sslmode={mode}")).unwrap();
            assert_eq!((c.tls.mode, c.pg.get_ssl_mode()), (ours, wire), "{mode}");
        }
        // The files' parameters are dlock's, after a password too.
        let e = err("postgres://u@h/db?password=hunter2&sslmode=disable&sslrootcert=/x/ca.pem&sslcert=/x/c.pem");
        assert!(e.contains("without `sslkey=`"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        assert!(err("postgres://u@h/db?sslkey=/k.pem").contains("without `sslcert=`"));
        assert!(err("postgres://u@h/db?sslrootcert=").contains("names no file"));
        // libpq 16's `sslrootcert=system`: verify-full, or an error.
        let e = err("postgres://u@h/db?sslmode=require&sslrootcert=system");
        assert!(e.contains("needs `sslmode=verify-full`"), "{e}");
        assert!(
            err("postgres://u@h/db?sslrootcert=system&sslmode=verify-ca")
                .contains("got `sslmode=verify-ca`")
        );
        let e = err("postgres://u@h/db?sslmode=disable&sslrootcert=/nowhere/ca.pem");
        assert!(e.contains("the files would go unused"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_modes_and_their_files() {
        use tokio_postgres::config::SslMode as Wire;
        // (`verify-ca` needs `sslrootcert`: `refuses_what_it_cannot_do`.)
        for (mode, ours) in [
            ("require", SslMode::Require),
            ("verify-full", SslMode::VerifyFull),
        ] {
            let c = parse(&format!("postgres://u@h/db?sslmode={mode}")).unwrap();
            assert_eq!(
                (c.tls.mode, c.pg.get_ssl_mode()),
                (ours, Wire::Require),
                "{mode}"
            );
        }
        let c = parse("postgres://u@h/db?sslrootcert=system").unwrap();
        assert_eq!(
            (c.tls.mode, c.tls.root),
            (SslMode::VerifyFull, Some(Root::System))
        );

        let dir = std::env::temp_dir().join(format!("dlock-pg-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let missing = dir.join("missing.pem");
        let (g, m) = (garbage.display(), missing.display());
        for (query, expect) in [
            (
                format!("sslmode=verify-full&sslrootcert={m}"),
                format!("`sslrootcert={m}`: cannot read the file"),
            ),
            (
                format!("sslmode=verify-ca&sslrootcert={g}"),
                format!("`sslrootcert={g}`: no PEM certificate"),
            ),
            (
                format!("sslmode=require&sslrootcert={g}"),
                format!("`sslrootcert={g}`: no PEM certificate"),
            ),
            (
                format!("sslmode=require&sslcert={m}&sslkey={g}"),
                format!("`sslcert={m}`: cannot read the file"),
            ),
            (
                format!("sslmode=require&sslcert={g}&sslkey={g}"),
                format!("`sslcert={g}`: no PEM certificate"),
            ),
        ] {
            let url = format!("postgres://u:hunter2@h/db?{query}");
            let e = parse(&url).unwrap_err();
            assert!(matches!(e, LockError::InvalidOption { .. }), "{e}");
            let e = e.to_string();
            assert!(e.contains(&expect), "{query}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_needs_the_feature() {
        for query in [
            "sslmode=require",
            "sslmode=verify-full",
            "sslrootcert=/ca.pem",
        ] {
            let e = err(&format!("postgres://u:hunter2@h/db?{query}"));
            assert!(e.contains(r#"features = ["postgres", "tls"]"#), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        parse("postgres://u@h/db?sslmode=prefer").unwrap();
        parse("postgres://u@h/db?sslmode=disable").unwrap();
    }
}
