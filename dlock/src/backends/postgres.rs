//! PostgreSQL: locks on session advisory locks (`pg_try_advisory_lock`),
//! shared with SQL code that takes the same numbers.
//!
//! # URL
//!
//! `postgres[ql]://[user[:password]@][host][:port][,host[:port]...][/dbname][?param=value&...]`,
//! libpq's URL syntax as `tokio_postgres::Config` reads it: several hosts,
//! `?host=/var/run/postgresql` for a Unix socket directory, `?port=`,
//! `?dbname=`, `?user=`, `?password=`, `?application_name=`,
//! `?connect_timeout=`, `?target_session_attrs=`, and TLS (below). dlock's own:
//!
//! - `prefix` (default `dlock`): the namespace of keys, hashed into the
//!   advisory key (see [`advisory_key_in`]); no `:` (the separator of
//!   `<prefix>:<key>`). Advisory keys are one space per database: two
//!   `?schema=`s with one prefix share their locks.
//! - `fence_retention` (default one day, at most 365 days): a key that
//!   issued no fence for this long loses its rows (see Protocol).
//! - `sessions` (default 4, at most 64): how many connections hold locks.
//!   Leases are spread over them; holding 1,000 locks opens 4 connections
//!   (plus one that listens for releases).
//! - `session_timeout` (default 30 s): the server ends a lock session that
//!   is silent that long (`idle_session_timeout`, and TCP keepalives and
//!   `tcp_user_timeout` of about the same length), so a frozen or vanished
//!   client's locks are freed within it. Each session speaks every third of
//!   it. A lease's ttl is capped at it ([`Lease::ttl`] reports the capped
//!   value).
//! - `schema` (default `public`): the schema of the two tables.
//! - `timeout` (default 5 s): the bound on connecting and on one request.
//! - `client_name`: the name written beside each lease (see `crate::inspect`).
//!
//! An unknown parameter is an error naming the closest known one. Passwords
//! never appear in errors or in `describe()`.
//!
//! # TLS
//!
//! With the `tls` feature (`features = ["postgres", "tls"]`; rustls with
//! `ring`, or the crypto provider the application installed), libpq's
//! parameters, with libpq's meanings:
//!
//! - `sslmode`: `disable` (plain only); `prefer`, the default (TLS if the
//!   server offers it, else plain; `allow` is read as `prefer`); `require`
//!   (TLS or no connection); `verify-ca` (TLS, and the server's certificate
//!   chain checked); `verify-full` (the chain and the host name checked:
//!   **the mode to use**, as for libpq).
//! - `sslrootcert=<file>`: the PEM CA certificates to trust. Without it,
//!   `verify-full` trusts Mozilla's roots (`webpki-roots`, as `rediss://`
//!   without `?ca=` does; `sslrootcert=system` says so explicitly and, as in
//!   libpq 16, asks for `verify-full`), and `verify-ca` is refused: a chain
//!   to a public root, for whatever host, proves nothing about the server.
//!   dlock does not read libpq's default files in `~/.postgresql/`.
//! - `sslcert=<file>` and `sslkey=<file>`: a client certificate (PEM, its
//!   chain) and its unencrypted PEM key (PKCS#8, PKCS#1 or SEC1), for
//!   servers whose `pg_hba.conf` says `cert` or `clientcert=verify-ca|verify-full`.
//!
//! What is checked of the server's certificate:
//!
//! | `sslmode` | without `sslrootcert` | with `sslrootcert` |
//! |---|---|---|
//! | `prefer`, `require` | only that the server holds its key (any certificate accepted) | the chain |
//! | `verify-ca` | refused | the chain |
//! | `verify-full` | the chain and the host name, to Mozilla's roots | the chain and the host name |
//!
//! `require` without `sslrootcert` is libpq's `require`: encrypted, but an
//! attacker able to intercept the connection can present any certificate.
//! The host name checked is the URL's host (an IP address is checked
//! against the certificate's IP addresses). One TLS configuration, built at
//! `connect` (an unreadable file or one without a PEM certificate or key is
//! [`LockError::InvalidOption`] naming the parameter and the path), serves
//! every connection of the backend: the lock sessions and the `LISTEN`
//! one. A failed handshake (an untrusted certificate, a name it does not
//! hold, a server without TLS under `require` or stricter) is
//! [`LockError::Backend`] within the connect timeout, with what to check.
//! Unlike libpq, `prefer` does not retry in the clear after a failed
//! handshake (with `sslrootcert`, an untrusted certificate is an error),
//! and `require` or stricter over a Unix socket (which never has TLS) is
//! refused where libpq would connect in the clear: use `prefer` or
//! `disable` there.
//! The channel binding of SCRAM (`channel_binding=require`) works over TLS.
//! Without the `tls` feature, `sslmode=require`, `verify-ca`,
//! `verify-full` and the file parameters are an error naming the feature,
//! and `prefer` connects in the clear. Tested against servers with
//! `ssl=on` in `tests/tests/postgres_tls.rs`.
//!
//! # Protocol
//!
//! - The advisory key of a lock is [`advisory_key_in`]`(prefix, key)`: the
//!   first 8 bytes of SHA-256 of `<prefix>:<key>`, big-endian, as a signed
//!   bigint. Stable across versions; psql computes the same number.
//! - `try_acquire` sends one statement on one session: `pg_try_advisory_lock`
//!   and, when granted, the next fencing token: an upsert of the key's row in
//!   `<schema>.dlock_fences` (`GREATEST(counter + 1, the server's clock in
//!   µs)`, created on first use, deleted once idle past `?fence_retention=`
//!   by a bounded sweep sent behind releases), and the holder's token, fence and expiry in the unlogged table
//!   `<schema>.dlock_holders` (for `inspect`, `list`, `force_release` and
//!   the renewal's check; unlogged, so that releases and renewals cost no
//!   WAL flush). Fencing tokens therefore increase strictly per key across
//!   releases, sessions, clients and server restarts; the counter's upsert
//!   is the one durable write (one commit) of an acquisition; a forgotten
//!   counter restarts at the clock, above every fence before it.
//! - Every session first pins `search_path` to `pg_catalog, pg_temp`, and
//!   dlock's tables are refused when a role dlock's role is not a member of
//!   (nor a superuser) owns them: no other role's function, operator or
//!   trigger runs as dlock's role.
//! - A session never asks for a key it holds (advisory locks are reentrant
//!   per session): each session keeps the set of its keys, and a key held
//!   through every session is busy.
//! - `release` is one statement: `pg_advisory_unlock`,
//!   `NOTIFY dlock_released, '<advisory key>'`, and the holder row cleared.
//! - `acquire`, its try refused, waits in the server's queue of the lock
//!   (a blocking `pg_advisory_lock`, deadline as `lock_timeout`) on an idle
//!   waiting session: waiters of all processes and SQL's own
//!   `pg_advisory_lock` are served in arrival order (`turns.rs`). With no
//!   idle waiting session it waits on a `LISTEN dlock_released` connection
//!   and tries again when its key is announced, with a re-check every
//!   second as the net for releases nobody announces. A dropped or
//!   timed-out attempt whose grant may have happened is undone.
//! - A full server lock table (`max_locks_per_transaction`) refuses an
//!   acquisition by name and costs no granted lease (`lock_table.rs`).
//! - `renew` reads, once per session per round, the session's own
//!   advisory locks in `pg_locks`, and moves the rows' expiry. A lock no
//!   longer held by the session is `Refused`; a row no longer naming the
//!   lease's token (`force_release`) is `Deleted` and the lock is unlocked;
//!   a session whose connection ended (`pg_terminate_backend`, a restart) is
//!   `SessionExpired` for every lease on it, and only those; the session's
//!   end raises the backend's loss alarm, so the watchdog asks at once
//!   rather than at the next renewal. A lease whose
//!   local deadline passes without a renewal is unlocked by the backend.
//!
//! # Read-write locks
//!
//! [`RwLock`](crate::RwLock) takes advisory locks of the two-`int4` form
//! (`pg_advisory_lock(int4, int4)`), a namespace PostgreSQL keeps apart
//! from the `bigint` one of plain locks, so a `Lock` and an `RwLock` of one
//! key are separate locks. The lock's keys are [`rw_advisory_key_in`]
//! (bytes 8..16 of the same SHA-256); readers take it with
//! `pg_try_advisory_lock_shared`, writers with `pg_try_advisory_lock`. A
//! waiting writer also holds a writer-intent key (bytes 16..24) until it
//! is granted, and a reader takes that key shared for an instant before
//! the lock, so readers that come after a waiting writer stay out (writers
//! do not starve). Write fences come from the counter row
//! `rw<TAB><prefix>:<key>` of `dlock_fences`; a read's fence is that
//! row's value read right after the grant (the last write's fence).
//! Releases are announced on the same channel; a dropped attempt undoes,
//! in the background on its session, whatever it may hold. A read or
//! write lease is lost when its session ends, as a lock's is.
//!
//! # Semaphores
//!
//! A semaphore of N permits is N slot advisory locks (`bigint` form) and a
//! count marker (two-`int4` form) that every holder holds shared: a permit
//! is the first slot `pg_try_advisory_lock` grants, and a caller whose
//! count differs from a marker in `pg_locks` is refused. See the
//! `permits` module's docs for the keys.
//!
//! # Leader election
//!
//! An [`Election`](crate::Election) is the plain lock of its name (its
//! fence is the term); the leader's record is a row of the unlogged table
//! `<schema>.dlock_leaders`, made on the first election, written on the
//! holding session only while it holds the lock, and counted only while
//! that session still does. Changes are announced on the release channel.
//! See the `election` module's docs.
//!
//! # Not yet
//!
//! `MultiLock` and `SegmentedLock` work key by key. Of libpq's TLS
//! parameters, `sslpassword` (encrypted client keys), `sslcrl`,
//! `ssl_min_protocol_version` and `sslnegotiation=direct` are not read (an
//! error naming the parameters dlock takes). `inspect`, `list` and `force_release` see plain locks
//! only.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
//! let pg = dlock::connect("postgres://app:secret@127.0.0.1:5432/app?sessions=2").await?;
//! let guard = dlock::Lock::new("nightly-report").with_backend(pg).acquire().await?;
//! // In SQL, `SELECT pg_try_advisory_lock(<advisory_key("nightly-report")>)` is now false.
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod config;
mod election;
mod held;
mod inspect;
mod listener;
mod lock_table;
mod permits;
mod renew_plain;
mod renew_rounds;
mod retention;
mod rw;
mod session;
mod setup;
mod sql;
#[cfg(feature = "tls")]
mod tls;
mod turns;

pub use self::election::MAX_VALUE_BYTES;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use self::config::Config;
use self::held::HeldMap;
use self::listener::{Listener, Waiters};
use self::session::{Pool, Reserved, Session};
use self::sql::Statements;
use crate::backend::{lease_deadline, AcquireRequest, Lease, LockBackend, Renewal};
use crate::{LockError, LockInfo};

/// How often a waiter tries again when no release was announced.
const RECHECK: Duration = Duration::from_secs(1);

/// The advisory key of the lock `key` under the default prefix (`dlock`):
/// what `SELECT pg_advisory_lock(<number>)` takes to exclude a dlock holder
/// of `key`, and to be excluded by one.
///
/// The number is the first 8 bytes of the SHA-256 of `dlock:<key>` (UTF-8),
/// read as a big-endian signed 64-bit integer. It never changes between
/// versions of dlock. psql computes the same number:
///
/// ```sql
/// SELECT ('x' || left(encode(sha256(convert_to('dlock:nightly-report', 'UTF8')), 'hex'), 16))::bit(64)::bigint;
/// -- then: SELECT pg_advisory_lock(that number);
/// ```
///
/// ```
/// use dlock::backends::postgres::advisory_key;
/// assert_eq!(advisory_key("job"), advisory_key("job"));
/// assert_ne!(advisory_key("job"), advisory_key("job2"));
/// ```
pub fn advisory_key(key: &str) -> i64 {
    advisory_key_in(config::DEFAULT_PREFIX, key)
}

/// The advisory key of the lock `key` for a backend whose URL says
/// `?prefix=<prefix>`: the first 8 bytes of the SHA-256 of
/// `<prefix>:<key>`, big-endian, signed (see [`advisory_key`]). The
/// backend refuses a prefix with `:` (it would make `<prefix>:<key>`
/// ambiguous), so such a prefix names no dlock lock.
///
/// ```
/// use dlock::backends::postgres::{advisory_key, advisory_key_in};
/// assert_eq!(advisory_key_in("dlock", "job"), advisory_key("job"));
/// ```
pub fn advisory_key_in(prefix: &str, key: &str) -> i64 {
    let digest = digest(prefix, key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The two `int4` keys of the read-write lock `key` under the default
/// prefix: what `SELECT pg_advisory_lock_shared(k1, k2)` takes to read
/// beside dlock's readers and exclude its writers, and
/// `pg_advisory_lock(k1, k2)` to write.
///
/// They are bytes 8..16 of the SHA-256 of `dlock:<key>` (the bytes after
/// those of [`advisory_key`]), big-endian, split into a signed high and
/// low half. psql computes the same numbers:
///
/// ```sql
/// SELECT ('x' || substr(encode(sha256(convert_to('dlock:prices', 'UTF8')), 'hex'), 17, 8))::bit(32)::int4,
///        ('x' || substr(encode(sha256(convert_to('dlock:prices', 'UTF8')), 'hex'), 25, 8))::bit(32)::int4;
/// -- then: SELECT pg_advisory_lock_shared(k1, k2);
/// ```
///
/// The two-`int4` form is a namespace of its own in PostgreSQL,
/// so the read-write lock and the plain lock of one key are separate
/// locks. Writers also take a writer-intent key, bytes 16..24 in the same
/// form, while they wait: readers that see it held stay out. Stable
/// across versions.
///
/// ```
/// use dlock::backends::postgres::{rw_advisory_key, rw_advisory_key_in};
/// assert_eq!(rw_advisory_key("job"), rw_advisory_key_in("dlock", "job"));
/// ```
pub fn rw_advisory_key(key: &str) -> (i32, i32) {
    rw_advisory_key_in(config::DEFAULT_PREFIX, key)
}

/// The two `int4` keys of the read-write lock `key` for a backend whose
/// URL says `?prefix=<prefix>` (see [`rw_advisory_key`]).
pub fn rw_advisory_key_in(prefix: &str, key: &str) -> (i32, i32) {
    let digest = digest(prefix, key);
    let hi = i32::from_be_bytes([digest[8], digest[9], digest[10], digest[11]]);
    let lo = i32::from_be_bytes([digest[12], digest[13], digest[14], digest[15]]);
    (hi, lo)
}

/// SHA-256 of `<prefix>:<key>`.
fn digest(prefix: &str, key: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(prefix.as_bytes())
        .chain_update(b":")
        .chain_update(key.as_bytes())
        .finalize()
        .into()
}

/// The PostgreSQL backend (see the module docs).
pub struct PostgresBackend {
    config: Config,
    /// The URL, password redacted.
    shown: String,
    statements: Statements,
    pool: Pool,
    /// The sessions acquisitions wait in the lock's queue on (`turns.rs`).
    waiting: Pool,
    /// Keys whose try was refused lately (`turns.rs`).
    contended: turns::Contended,
    held: Arc<Mutex<HeldMap>>,
    waiters: Arc<Waiters>,
    listener: tokio::sync::Mutex<Option<Listener>>,
    /// Whether the leaders' table is known to exist (made on the first use
    /// of an election).
    leaders_ready: std::sync::atomic::AtomicBool,
    /// Raised when a lock session ends (see `LockBackend::loss_alarm`).
    alarm: Arc<tokio::sync::watch::Sender<u64>>,
    /// Deletes rows idle past `?fence_retention=`, behind releases.
    sweeper: retention::Sweeper,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("url", &self.shown)
            .field("config", &self.config)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A transport or server failure of the backend `shown`.
pub(super) fn failed(shown: &str, e: impl Into<Failure>) -> LockError {
    LockError::backend(shown, e.into().0)
}

/// The text of a failure: tokio-postgres's own `Display` of a server error
/// is only "db error", so the server's severity, code, message, detail and
/// hint are spelled out (none of them holds the password).
pub(super) struct Failure(String);

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
            if let Some(detail) = db.detail() {
                text.push_str(&format!(" ({detail})"));
            }
            if let Some(hint) = db.hint() {
                text.push_str(&format!("; hint: {hint}"));
            }
            return Failure(text);
        }
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            let more = s.to_string();
            if !text.contains(&more) {
                text.push_str(&format!(": {more}"));
            }
            source = s.source();
        }
        Failure(text)
    }
}

impl From<String> for Failure {
    fn from(text: String) -> Self {
        Failure(text)
    }
}

impl From<&str> for Failure {
    fn from(text: &str) -> Self {
        Failure(text.to_owned())
    }
}

/// A request whose answer may be a grant: if dropped before that answer is
/// read, the key is unlocked in the background on the same session.
struct Pending {
    session: Option<Arc<Session>>,
    key: i64,
}

impl Pending {
    fn disarm(&mut self) {
        self.session = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            held::unlock_in_background(session, self.key);
        }
    }
}

impl PostgresBackend {
    /// Connects to the server of `url` (see the module docs for its form),
    /// opens the first lock session and creates the tables if missing.
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a malformed URL, an unknown
    /// parameter, a TLS file that cannot be read or used, `sslmode=require`
    /// (or stricter) without the `tls` feature, a read-only standby, or a
    /// role that may not create the tables; [`LockError::Backend`] for a
    /// server that cannot be reached, refuses the login or fails the TLS
    /// handshake, within the connect timeout.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backends::postgres::PostgresBackend;
    /// let pg = PostgresBackend::connect("postgres://app@/app?host=/var/run/postgresql").await?;
    /// assert_eq!(pg.session_timeout(), std::time::Duration::from_secs(30));
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        crate::lease::background::check()?;
        let config = config::parse(url)?;
        let shown = config::shown(url);
        let statements = Statements::new(&config.schema, config.fence_retention);
        let alarm = Arc::new(tokio::sync::watch::channel(0).0);
        let first = {
            let (config, statements, shown) = (config.clone(), statements.clone(), shown.clone());
            let alarm = alarm.clone();
            crate::lease::background::run(async move {
                session::open(&config, &statements, &shown, true, alarm).await
            })
            .await?
        };
        let pool = Pool::new(config.sessions);
        let sweeper = retention::Sweeper::new(config.fence_retention);
        sweeper.maybe(&first, &statements.sweep, &shown);
        pool.adopt(first);
        let sessions = config.sessions;
        Ok(PostgresBackend {
            sweeper,
            config,
            shown,
            statements,
            pool,
            waiting: Pool::new(sessions),
            contended: turns::Contended::default(),
            held: Arc::new(Mutex::new(HeldMap::new())),
            waiters: Arc::new(Waiters::default()),
            listener: tokio::sync::Mutex::new(None),
            leaders_ready: std::sync::atomic::AtomicBool::new(false),
            alarm,
        })
    }

    /// How long the server lets a lock session be silent before it ends it
    /// and frees its locks (`?session_timeout=`): a frozen client's locks
    /// are free after about this long, and every lease's ttl is capped at it.
    pub fn session_timeout(&self) -> Duration {
        self.config.session_timeout
    }

    /// The fence table's name for `key`: `<prefix>:<key>`.
    fn name_of(&self, key: &str) -> String {
        format!("{}:{key}", self.config.prefix)
    }

    fn clamp(&self, ttl: Duration) -> Duration {
        ttl.min(self.config.session_timeout)
    }

    /// `fut` within the request timeout, its error the backend's.
    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.config.timeout, fut).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(failed(&self.shown, e)),
            Err(_) => Err(self.silent()),
        }
    }

    fn silent(&self) -> LockError {
        failed(
            &self.shown,
            format!("the server did not answer within {:?}", self.config.timeout),
        )
    }

    /// Opens a lock session on dlock's background runtime.
    async fn open_session(&self) -> Result<Arc<Session>, LockError> {
        let (config, statements, shown, alarm) = (
            self.config.clone(),
            self.statements.clone(),
            self.shown.clone(),
            self.alarm.clone(),
        );
        crate::lease::background::run(async move {
            session::open(&config, &statements, &shown, false, alarm).await
        })
        .await
    }

    /// A live session for a read (inspect, list, force_release).
    async fn any_session(&self) -> Result<Arc<Session>, LockError> {
        match self.pool.reserve(&[], || self.open_session()).await? {
            Reserved::On(session) => Ok(session),
            Reserved::Busy => Err(failed(&self.shown, "no session could be opened")),
        }
    }

    /// Runs `attempt` on `state` (what the attempts need, and what they
    /// carry from one to the next) until it gives a lease, or `Ok(None)` once
    /// `deadline` passes: the wait of a lock, a read-write lock or a
    /// semaphore whose advisory key is `key`. A release's notification on
    /// `key` wakes it; the re-check timer too, since a lock freed by another
    /// client announces nothing.
    async fn wait_for<S: Send>(
        &self,
        key: i64,
        deadline: Option<Instant>,
        state: &mut S,
        attempt: impl for<'s> Fn(&'s mut S) -> Attempt<'s> + Send,
    ) -> Result<Option<Lease>, LockError> {
        let waiting = self.waiters.register(key);
        loop {
            // Listening before the attempt: a release after it is not missed.
            self.ensure_listener().await;
            let notified = waiting.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let Some(answer) = crate::backend::deadline::until(deadline, attempt(state)).await
            else {
                return Ok(None);
            };
            if let Some(lease) = answer? {
                return Ok(Some(lease));
            }
            let Some(nap) = recheck_at(deadline) else {
                return Ok(None);
            };
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(nap.into()) => {}
            }
        }
    }

    /// Makes sure the listening connection is up; false if it cannot be.
    async fn ensure_listener(&self) -> bool {
        let mut listener = self.listener.lock().await;
        if listener.as_ref().is_some_and(Listener::is_alive) {
            return true;
        }
        let (config, shown, waiters) = (
            self.config.clone(),
            self.shown.clone(),
            Arc::downgrade(&self.waiters),
        );
        match crate::lease::background::run(async move {
            Listener::open(&config, &shown, waiters).await
        })
        .await
        {
            Ok(new) => {
                *listener = Some(new);
                listener::listening_again(&self.waiters);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "PostgreSQL listener could not connect; waiters re-check on a timer");
                false
            }
        }
    }

    /// One attempt: a free session, `pg_try_advisory_lock` and the fence.
    async fn try_once(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let key = advisory_key_in(&self.config.prefix, &req.key);
        let session = match self.pool.reserve(&[key], || self.open_session()).await? {
            Reserved::On(session) => session,
            Reserved::Busy => return Ok(None),
        };
        let mut pending = Pending {
            session: Some(session.clone()),
            key,
        };
        let ttl = self.clamp(req.ttl);
        let name = self.name_of(&req.key);
        let secs = ttl.as_secs_f64();
        let sent = Instant::now();
        let row = self
            .bounded_acquire(
                session
                    .client
                    .query_one(&session.prepared.acquire, &[&key, &name, &req.token, &secs]),
            )
            .await?;
        pending.disarm();
        let granted: bool = row.get(0);
        if !granted {
            session.unreserve(key);
            return Ok(None);
        }
        let fence: Option<i64> = row.get(1);
        let valid_until = lease_deadline(sent, ttl);
        held::remember(
            &self.held,
            &req.token,
            session,
            key,
            held::Hold::Plain,
            valid_until,
        );
        Ok(Some(Lease {
            key: req.key.clone(),
            token: req.token.clone(),
            ttl,
            fencing_token: fence.and_then(|f| u64::try_from(f).ok()),
            valid_until,
            resource: format!("pg_advisory_lock({key})"),
        }))
    }
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        self.pool.close_all();
        self.waiting.close_all();
    }
}

#[async_trait]
impl LockBackend for PostgresBackend {
    fn describe(&self) -> String {
        self.shown.clone()
    }

    fn client_name(&self) -> Option<&str> {
        Some(
            self.config
                .client_name
                .as_deref()
                .unwrap_or_else(|| crate::inspect::default_client_name()),
        )
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.try_once(req).await
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.acquire_in_turn(req, deadline).await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_plain(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(h) = lock(&self.held).remove(&lease.token) else {
            return Ok(false);
        };
        if !h.session.is_alive() {
            return Ok(false);
        }
        let mut pending = Pending {
            session: Some(h.session.clone()),
            key: h.key,
        };
        let name = self.name_of(&lease.key);
        let released = self
            .release_on(&h.session, h.key, &name, &lease.token)
            .await;
        let released = match released {
            Ok(released) => released,
            Err(_) if !h.session.is_alive() => {
                pending.disarm();
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        pending.disarm();
        h.session.unreserve(h.key);
        self.sweeper
            .maybe(&h.session, &self.statements.sweep, &self.shown);
        Ok(released)
    }

    fn capabilities(&self) -> crate::backend::Capabilities<'_> {
        crate::backend::Capabilities::all(self)
    }

    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.alarm.subscribe())
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.inspect_key(key).await
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        self.force_release_key(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, LockInfo)>, LockError> {
        self.list_keys(prefix).await
    }
}

/// When a waiter whose try was refused tries again with no release
/// announced (the re-check, jittered so that waiters spread out), at the
/// latest at `deadline`; `None` once the deadline has passed.
fn recheck_at(deadline: Option<Instant>) -> Option<Instant> {
    let jitter = Duration::from_millis(u64::from(rand_byte()) * 2);
    let nap = Instant::now() + RECHECK - Duration::from_millis(256) + jitter;
    match deadline {
        Some(d) if Instant::now() >= d => None,
        Some(d) => Some(nap.min(d)),
        None => Some(nap),
    }
}

/// One attempt of a wait (see `PostgresBackend::wait_for`), borrowing its
/// state.
type Attempt<'s> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<Lease>, LockError>> + Send + 's>,
>;

/// A random byte, for jitter.
fn rand_byte() -> u8 {
    let mut b = [0u8; 1];
    let _ = getrandom::fill(&mut b);
    b[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed vectors: these numbers are a public contract (SQL code takes
    /// them), so they must never change.
    #[test]
    fn advisory_keys_never_change() {
        assert_eq!(advisory_key("job"), advisory_key_in("dlock", "job"));
        assert_eq!(advisory_key("job"), FIXED_JOB);
        assert_eq!(advisory_key_in("billing", "invoice/7"), FIXED_BILLING);
        assert_eq!(advisory_key(""), FIXED_EMPTY);
    }
    // Computed independently: `SELECT ('x' || left(encode(sha256(convert_to(
    // 'dlock:job', 'UTF8')), 'hex'), 16))::bit(64)::bigint` in psql.
    const FIXED_JOB: i64 = -468_033_427_176_012_955;

    /// The read-write lock's numbers are a public contract too.
    #[test]
    fn rw_advisory_keys_never_change() {
        assert_eq!(rw_advisory_key("job"), (-1_341_658_790, 645_462_815));
        assert_eq!(
            rw_advisory_key_in("billing", "invoice/7"),
            (1_866_582_156, 827_806_218)
        );
    }
    const FIXED_BILLING: i64 = 2_343_783_483_635_354_943;
    const FIXED_EMPTY: i64 = -5_487_780_231_628_317_163;
}
