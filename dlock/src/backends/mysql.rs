//! MySQL and MariaDB: locks on named locks (`GET_LOCK`), shared with SQL
//! code that takes the same names.
//!
//! # URL
//!
//! `mysql://user[:password]@host[:port]/database[?param=value&...]` (port
//! 3306 by default; one server: a named lock lives in one server's
//! memory), and `mysqls://` for TLS (below). Parameters:
//!
//! - `prefix` (default `dlock.<database>`, see [`default_prefix`]; at
//!   most 30 characters, no `:`): the namespace of lock names,
//!   `<prefix>:<key>` (see [`lock_name_in`]). Named locks are global to
//!   the server, so the default keeps applications of different databases
//!   apart; give the same `?prefix=` to share locks across databases.
//! - `fence_retention` (default one day, at most 365 days): a name that
//!   issued no fence for this long loses its row (see Protocol).
//! - `sessions` (default 4, at most 64): how many connections hold locks,
//!   and how many more may wait in the server's queues at once. Leases are
//!   spread over them; holding 1,000 locks opens 4 connections.
//! - `session_timeout` (default 30 s, whole seconds from 2 s to a day): the
//!   server ends a lock session silent that long (its `wait_timeout`), so a
//!   frozen or vanished client's locks are freed within it. Each session
//!   speaks every third of it. A lease's ttl is capped at it
//!   ([`Lease::ttl`](crate::backend::Lease::ttl) reports the capped value).
//! - `timeout` (default 5 s): the bound on connecting and on one request.
//! - `tcp_keepalive` (default a third of the session timeout; `0`: off).
//! - `client_name`: the name written beside each lease (see `crate::inspect`).
//! - `ssl-mode`, `ssl-ca`: TLS, below.
//!
//! An unknown parameter is an error naming the closest known one. Passwords
//! never appear in errors or in `describe()`.
//!
//! # TLS
//!
//! With the `tls` feature (`features = ["mysql", "tls"]`; rustls with
//! `ring`): `mysqls://` is `mysql://` with `ssl-mode=VERIFY_IDENTITY`.
//! `ssl-mode` takes the names of MySQL's own client: `DISABLED` (the
//! default of `mysql://`), `REQUIRED` (encrypted, no certificate checked),
//! `VERIFY_CA` (the chain to `ssl-ca=<PEM file>`, which it needs) and
//! `VERIFY_IDENTITY` (the chain, to `ssl-ca` or else Mozilla's roots, and
//! the host name). `PREFERRED` is not offered (it falls back to plain text
//! without saying). Without the `tls` feature, any mode but `DISABLED` is an
//! error naming the feature.
//!
//! # Protocol
//!
//! - The lock of a key is the named lock [`lock_name_in`]`(prefix, key)`:
//!   `<prefix>:<key>` when that is at most 64 characters (MySQL 8's
//!   limit), else the prefix and a SHA-256 prefix of it; SQL code takes the
//!   same lock with `GET_LOCK('<that name>', timeout)`.
//! - `try_acquire` sends one round trip on a lock session: `GET_LOCK(name,
//!   0)` and, when granted, the upsert of the name's row in
//!   `` `<database>`.`dlock_fences` `` (the next fence,
//!   `GREATEST(last + 1, the server's clock in µs)` through
//!   `LAST_INSERT_ID(expr)`, and the holder: owner token, `CONNECTION_ID()`,
//!   ttl), then the fence read back. Fencing tokens therefore increase
//!   strictly per name across releases, sessions, clients and server
//!   restarts (InnoDB keeps the counter); a forgotten row restarts at the
//!   clock, above every fence before it.
//! - A session never asks for a name it holds: `GET_LOCK` is re-entrant per
//!   session (since MySQL 5.7 and MariaDB 10.0.2 a session holds many
//!   names, and a second `GET_LOCK` of one it holds succeeds), so each
//!   session keeps the set of its names, and a name held through every
//!   session is busy. Two leases of one process on one key never share a
//!   grant.
//! - `release` is one statement: the row's holder read, then
//!   `RELEASE_LOCK(name)`; no write (a row counts only while
//!   `IS_USED_LOCK(name)` is its session).
//! - `acquire`, its try refused, waits in the server's queue of the lock:
//!   `GET_LOCK(name, seconds left)` on a waiting session of its own, so
//!   dlock's waiters of every process and SQL's own `GET_LOCK` callers are
//!   served by the server together. A dropped wait is ended with `KILL
//!   QUERY` from a lock session (no new connection): its waiting session
//!   leaves the queue, lets go what it may have been granted in the race,
//!   and is idle in its pool again (`cancel.rs`); a dropped try's grant is
//!   let go on its session before that session's next request.
//! - `renew` asks each session, once per round, whether
//!   `IS_USED_LOCK(name) = CONNECTION_ID()` for each of its leases and
//!   whether the row still names the lease's token: a lock no longer held
//!   is `Refused`, a cleared row (`force_release`) is `Deleted` (and the
//!   lock let go), a session whose connection ended (`KILL`, a restart, a
//!   network failure) is `SessionExpired` for every lease on it, and only
//!   those; the session's end rings the backend's loss alarm. A session's
//!   end is heard at once by its lifeline (`lifeline.rs`): a private named
//!   lock the session takes, which a watcher connection waits for. A lease
//!   whose local deadline passes without a renewal is let go by the
//!   backend.
//!
//! # Guarantees and failures
//!
//! - The server frees a session's locks when the session ends: a killed
//!   client process at once (its connection closes), a frozen client or a
//!   cut network after `session_timeout` (`wait_timeout`), a server
//!   restart at once. The lease's local deadline (its ttl, capped at the
//!   session timeout, from when the request was sent) always comes first.
//! - A stopped (`SIGSTOP`) server answers nothing: renewals fail, and each
//!   lease is lost at its local deadline; a request is bounded by
//!   `timeout`.
//! - `inspect`, `list` and `force_release` read dlock's rows with
//!   `IS_USED_LOCK`: a name held by SQL's own `GET_LOCK` shows as held
//!   with no holder. `force_release` clears the row: the holder's next
//!   renewal is refused and it lets go (within a third of its ttl). Taking
//!   a lock from its session at once needs `KILL <IS_USED_LOCK(name)>`,
//!   which ends every lock of that session and needs `CONNECTION ADMIN`
//!   (or `SUPER`) for another account's sessions; dlock never sends it.
//!
//! # Least privilege
//!
//! `GET_LOCK` needs no privilege. dlock's account needs, on its database:
//!
//! ```sql
//! CREATE TABLE app.dlock_fences (name VARBINARY(256) NOT NULL PRIMARY KEY,
//!   lock_key VARBINARY(768) NOT NULL, fence BIGINT NOT NULL, holder VARBINARY(200) NULL,
//!   conn BIGINT UNSIGNED NULL, ttl_ms BIGINT NOT NULL DEFAULT 0,
//!   renewed_us BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB;   -- or GRANT CREATE, and dlock makes it
//! GRANT SELECT, INSERT, UPDATE, DELETE ON app.dlock_fences TO 'locker'@'%';
//! ```
//!
//! Without `SELECT`, `INSERT` or `UPDATE`, `connect` is refused (an
//! [`LockError::InvalidOption`] naming the privilege, the account and the
//! `GRANT` to run; each is tried on no row); an acquisition the server
//! refuses later (a privilege revoked) is a [`LockError::Backend`] naming
//! the key; without `DELETE` only the retention sweep fails (logged at debug); with
//! neither the table nor `CREATE`, `connect` is an
//! [`LockError::InvalidOption`] that says what to grant. MySQL has no
//! table owners: dlock refuses a view, a non-InnoDB table or a table with a
//! trigger in its table's place (see `setup.rs`).
//!
//! # MySQL 8
//!
//! Tested against MariaDB 10.11. MySQL 8's `GET_LOCK` (documented by
//! MySQL) refuses names longer than 64 characters (dlock hashes longer
//! ones, on both servers), and its locks are seen in
//! `performance_schema.metadata_locks`; `VALUES()` in the upsert is
//! deprecated there (a warning, not an error).
//!
//! # Semaphores
//!
//! A semaphore of N permits (at most 1,000) is N slot named locks
//! ([`permit_slot_name`]), a permit one slot held by a session (renewed,
//! released and lost as a lock is), the count a row of `dlock_fences`
//! changed only under the semaphore's admin named lock while no permit of
//! the old count is out. Waiters queue on a door named lock; the head
//! waiter watches one slot at a time (`GET_LOCK(slot, 0.2 s)`), so with
//! N > 1 a release of another slot is seen within 0.2 s (a timer), a
//! release of the watched slot at once. Details in `permits.rs`.
//!
//! # Not offered
//!
//! Read-write locks (`GET_LOCK` has no shared mode: refused with
//! [`no_rw_locks`](crate::backend::no_rw_locks)) and elections
//! ([`no_elections`](crate::backend::no_elections): MySQL has no
//! `LISTEN`/`NOTIFY` or other server notification a watcher could wait
//! on, so `observe()` would have to poll). `MultiLock` and
//! `SegmentedLock` work key by key.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
//! let mysql = dlock::connect("mysql://app:secret@127.0.0.1:3306/app").await?;
//! let guard = dlock::Lock::new("nightly-report").with_backend(mysql).acquire().await?;
//! // In SQL, `SELECT IS_USED_LOCK('dlock.app:nightly-report')` now names dlock's session.
//! guard.release().await?;
//! # Ok(()) }
//! ```

// The files of this backend, by concern:
// - URL / configuration: `config.rs` (`url/parts.rs` + `url/options.rs`, the client's `Opts`;
//   `?fence_retention=` read by `backends/fence_retention.rs`, as on Redis and PostgreSQL);
//   TLS: `tls.rs` (`?ssl-mode=` and the client's TLS options)
// - lock names (64 characters at most, longer ones hashed): `names.rs`
// - requests: `sql.rs`: every statement, names and tokens as hex literals; answers: `rows.rs`
//   (every result set of a batch, typed columns)
// - sessions: `session.rs`: `Session` (a connection behind a lock, each request a task of its own on
//   dlock's runtime, undone if its caller left; the names held or asked for; a ping every third of
//   the session timeout), `Pool` (bounded slots, least loaded session without the name)
// - the first session's checks (table created if missing, refused if not dlock's kind): `setup.rs`
// - one attempt and the grant's bookkeeping: `acquire.rs`
// - waiting in the server's queue on a waiting session: `waiting.rs`
// - held leases and the reaper: `held.rs`; a session's end heard at once: `lifeline.rs`
// - renewal: `renew.rs`
// - the `LockBackend` impl: `lock_backend.rs`
// - semaphores (slot locks, the count row, the door): `permits.rs`, `permit_sql.rs`,
//   `permit_wait.rs`, `permit_renew.rs`
// - operator's view: `inspect.rs`
// - bounded rows (`?fence_retention=`): `retention.rs` (the sweep)
mod acquire;
mod cancel;
mod config;
mod held;
mod inspect;
mod lifeline;
mod lock_backend;
mod names;
mod permit_renew;
mod permit_sql;
mod permit_wait;
mod permits;
mod renew;
mod retention;
mod rows;
mod session;
mod setup;
mod sql;
mod tls;
mod waiting;

pub use self::names::{default_prefix, lock_name, lock_name_in, MAX_NAME_CHARS};
pub use self::permit_sql::{permit_slot_name, permit_slot_name_in};

use crate::backends::sessions::Sessions;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use self::config::Config;
use self::held::HeldMap;
use self::session::Session;
use self::sql::Statements;
use crate::backend::transient::Transient;
use crate::LockError;

/// The MySQL/MariaDB backend (see the module docs).
pub struct MysqlBackend {
    config: Config,
    /// The URL, password redacted.
    shown: String,
    statements: Statements,
    /// The sessions tries run on, and those waits queue on.
    sessions: Sessions<Session>,
    /// Names whose try was refused lately (`waiting.rs`).
    contended: waiting::Contended,
    held: Arc<Mutex<HeldMap>>,
}

impl std::fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("url", &self.shown)
            .field("config", &self.config)
            .field("sessions", &self.sessions)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A transport or server failure of the backend `shown`; one that may pass
/// is marked so, and a waiting acquisition asks again.
pub(super) fn failed(shown: &str, e: impl Into<Failure>) -> LockError {
    let Failure {
        text, transient, ..
    } = e.into();
    if transient {
        LockError::backend(shown, Transient::new(text))
    } else {
        LockError::backend(shown, text)
    }
}

/// The text of a failure, whether it may pass, and whether the connection
/// is broken (then its session is closed).
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub(super) text: String,
    pub(super) transient: bool,
    pub(super) broken: bool,
}

impl Failure {
    /// The server did not answer within `limit`.
    pub(super) fn unanswered(limit: Duration) -> Self {
        Failure {
            text: format!("the server did not answer within {limit:?}"),
            transient: true,
            broken: true,
        }
    }

    /// The session's connection was closed before.
    pub(super) fn closed() -> Self {
        Failure {
            text: "the session's connection is closed".into(),
            transient: true,
            broken: true,
        }
    }
}

/// Server errors that pass: too many connections, the server shutting
/// down, a connection killed, a lock wait or deadlock.
fn transient_code(code: u16) -> bool {
    matches!(
        code,
        1040 | 1053 | 1077 | 1079 | 1152 | 1158..=1161 | 1205 | 1213 | 1317 | 1927 | 4031
    )
}

impl From<mysql_async::Error> for Failure {
    fn from(e: mysql_async::Error) -> Self {
        match &e {
            mysql_async::Error::Server(s) => Failure {
                text: format!("error {} ({}): {}", s.code, s.state, s.message),
                transient: transient_code(s.code),
                // A killed connection or a server going away.
                broken: matches!(s.code, 1053 | 1077 | 1079 | 1152 | 1927 | 4031),
            },
            // A bad URL value the client read (not the password: the
            // client's options errors name the option).
            mysql_async::Error::Url(_) => Failure {
                text: e.to_string(),
                transient: false,
                broken: true,
            },
            _ => Failure {
                text: e.to_string(),
                transient: true,
                broken: true,
            },
        }
    }
}

impl From<String> for Failure {
    fn from(text: String) -> Self {
        Failure {
            text,
            transient: false,
            broken: false,
        }
    }
}

impl From<&str> for Failure {
    fn from(text: &str) -> Self {
        Failure::from(text.to_owned())
    }
}

impl MysqlBackend {
    /// Connects to the server of `url` (see the module docs for its form),
    /// opens the first lock session and creates the table if missing.
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a malformed URL, an unknown
    /// parameter, TLS without the `tls` feature, or an account that may
    /// not create or use the table; [`LockError::Backend`] for a server
    /// that cannot be reached or refuses the login, within the timeout.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backends::mysql::MysqlBackend;
    /// let mysql = MysqlBackend::connect("mysql://app:secret@127.0.0.1/app").await?;
    /// assert_eq!(mysql.session_timeout(), std::time::Duration::from_secs(30));
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = config::parse(url)?;
        let shown = crate::url::redact(url);
        let statements = Statements::new(&config.database, config.session.fence_retention);
        let open_first = {
            let (config, statements, shown) = (config.clone(), statements.clone(), shown.clone());
            |alarm| async move { session::open(&config, &shown, alarm, Some(&statements)).await }
        };
        let (sessions, first) = Sessions::open(&config.session, open_first).await?;
        let sweep = statements.sweep(retention::BATCH);
        retention::sweep_if_due(&sessions.sweeper, &first, sweep);
        Ok(MysqlBackend {
            config,
            shown,
            statements,
            sessions,
            contended: waiting::Contended::default(),
            held: Arc::new(Mutex::new(HeldMap::new())),
        })
    }

    /// How long the server lets a lock session be silent before it ends it
    /// and frees its locks (`?session_timeout=`): a frozen client's locks
    /// are free after about this long, and every lease's ttl is capped at it.
    pub fn session_timeout(&self) -> Duration {
        self.config.session.session_timeout
    }

    /// The lock name of `key` (`GET_LOCK`'s).
    fn name_of(&self, key: &str) -> String {
        lock_name_in(&self.config.prefix, key)
    }

    /// What the table keeps as the key: `<prefix>:<key>`.
    fn key_of(&self, key: &str) -> String {
        format!("{}:{key}", self.config.prefix)
    }

    fn clamp(&self, ttl: Duration) -> Duration {
        ttl.min(self.config.session.session_timeout)
    }

    /// Opens a session on dlock's background runtime.
    async fn open_session(&self) -> Result<Arc<Session>, LockError> {
        let (config, shown) = (self.config.clone(), self.shown.clone());
        let alarm = self.sessions.alarm.clone();
        crate::lease::background::run(
            async move { session::open(&config, &shown, alarm, None).await },
        )
        .await
    }

    /// A live session for a read (inspect, list, force_release).
    async fn any_session(&self) -> Result<Arc<Session>, LockError> {
        let open = || self.open_session();
        self.sessions.any(open, &self.shown).await
    }
}
