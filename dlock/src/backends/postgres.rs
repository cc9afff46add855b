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
//!   it. A lease's ttl is capped at it ([`Lease::ttl`](crate::backend::Lease::ttl) reports the capped
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
//! - Every session first claims its server session (the custom setting
//!   `dlock.session`) and a second connection checks it landed elsewhere:
//!   a transaction or statement pooler (PgBouncer `pool_mode =
//!   transaction`) is refused at `connect` (see the backends guide,
//!   *Poolers*). Each session switches off `statement_timeout`,
//!   `lock_timeout` and `idle_in_transaction_session_timeout`, whatever the
//!   role's defaults.
//! - A session never asks for a key it holds (advisory locks are reentrant
//!   per session): each session keeps the set of its keys, and a key held
//!   through every session is busy.
//! - `release` is one statement: `pg_advisory_unlock`,
//!   `NOTIFY dlock_released, '<advisory key>'`, and the holder row cleared.
//! - `acquire`, its try refused, waits in the server's queue of the lock
//!   (a blocking `pg_advisory_lock` in a `DO` block that ends without an
//!   error when granted, out of time — deadline as `lock_timeout` — or
//!   cancelled) on an idle waiting session, then claims the lock (fence
//!   and holder row): waiters of all processes and SQL's own
//!   `pg_advisory_lock` are served in arrival order (`turns.rs`). A
//!   dropped wait leaves the queue at once: `pg_cancel_backend` from a lock
//!   session, the lock let go if it was granted in the race, the waiting
//!   session kept; the server logs nothing. With no
//!   idle waiting session it waits on a `LISTEN dlock_released` connection
//!   and tries again when its key is announced, with a re-check every
//!   second as the net for releases nobody announces. A dropped or
//!   timed-out attempt whose grant may have happened is undone, by an
//!   unlock that first checks the session holds the lock (the server logs
//!   a warning for every unlock of a lock the session does not hold).
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
//! is the first slot `pg_try_advisory_lock` grants (n slots at once for
//! `acquire_many(n)`, all or none, behind the semaphore's gate lock, for
//! which waiters line up in the server's lock queue), and a caller whose
//! count differs from a marker in `pg_locks` is refused. See the
//! `permits` and `permits_line` modules' docs.
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

// The files of this backend, by concern (what ARCHITECTURE.md's "Inside a backend"
// table points to):
// - advisory keys (the numbers `pg_advisory_lock` takes): `keys.rs`
// - the `LockBackend` impl, each call handed on: `lock_backend.rs`
// - URL / configuration: `config.rs`: dlock's parameters taken out of the query (`?prefix=`
//   without `:`; `verify-ca` only with `sslrootcert`), the rest (libpq's, an allow-list) handed to
//   `tokio_postgres::Config::from_str`; libpq's TLS parameters (`sslmode`, `sslrootcert`,
//   `sslcert`, `sslkey`) read by dlock (`TlsParams`, in `tls_params.rs`, which both the
//   parser and the connector stand on; tokio-postgres is told only disable/prefer/require)
// - TLS (feature `tls`): `tls.rs`: the rustls `ClientConfig` of the `TlsParams`, built once at
//   `connect` and kept in `Config` (tokio-postgres-rustls's `MakeRustlsConnect`, with channel
//   binding): per mode the verifier (`AnyCertificate`: the handshake signature only; `ChainOnly`:
//   the chain to the roots, no name; rustls's `WebPkiServerVerifier` for `verify-full`), roots
//   from `sslrootcert` or `webpki-roots`, the client certificate; `session.rs`'s `connect` (every
//   lock session and the listener) uses it, and adds what to check to a failed handshake's error
// - requests: `sql.rs`: every statement, built once with the quoted schema (`dlock_fences`: the
//   logged counter, the one durable write of an acquisition; `dlock_holders`: unlogged, holder
//   token, fence, expiry, what release, renewal, inspect, list and force_release write or read);
//   `pg_locks` matched by `classid`/`objid` = high/low 32 bits, `objsubid` = 1, this database
// - sessions: `session.rs`: `Pool` (bounded slots, least loaded session without the key; a dead
//   slot refilled on demand, one connect at a time), `Session` (client, prepared statements, the
//   set of advisory keys held or asked for, alive flag, the connection task on dlock's background
//   runtime, a ping every `session_timeout`/3); every session first runs `setup.rs`'s
//   `PIN_SEARCH_PATH` (`search_path = pg_catalog, pg_temp`); the first session runs `setup.rs`'s
//   checks (`pg_is_in_recovery()`, `dlock_fences` and `dlock_holders` created if missing, and
//   refused when their owner is a role dlock's role is not a member of nor a superuser:
//   `check_owners`, also run on `dlock_leaders` by `ensure_leaders`)
// - poolers: `pooler.rs`: each session's setup `SET`s (role defaults switched off) and its
//   claim of `dlock.session` in one simple query, then a probe connection; a transaction or
//   statement pooler is `InvalidOption` naming it (also SQLSTATE 26000, mapped in `failed`)
// - bounded rows: `retention.rs`: `?fence_retention=` (parsed in `config.rs`); fences are
//   `GREATEST(last + 1, clock µs)` (`sql.rs`'s `NOW_US`), so a counter below `now - retention` is
//   an idle key's; `Sweeper` sends one bounded `DELETE` (`sql.rs`'s `sweep`: 1,000 rows of each
//   table, picked by `ctid`) at connect and behind releases, at most once per
//   `min(retention, 60 s)`, in the background on the releasing session
// - waiting in line: `listener.rs`: one `LISTEN dlock_released` connection per backend,
//   `Waiters` (a `Notify` per advisory key, registered before each attempt, woken with
//   `notify_waiters`; and the inboxes of election observers, per advisory key); one wait loop,
//   `waiting.rs`'s `wait_for`, for locks, read-write locks (`rw.rs`) and permits (`permits.rs`):
//   each an attempt within `crate::deadline::until` and a nap until `recheck_at` (the jittered 1 s
//   re-check, capped at the deadline) or the announcement
// - leader election (`ElectionBackend`): `election.rs`: the election is the plain lock of its
//   name; the record is a row of the unlogged `dlock_leaders` (token, writing session's pid, term,
//   value), made on first use (`ensure_leaders`: asks `to_regclass` first, since `CREATE … IF NOT
//   EXISTS` needs the right even when the table is there); `proclaim` on the holding session
//   checks its own `pg_locks` row and the holder row; `leader` joins the record with the holder
//   row and `pg_locks` of the writing pid; announcements on `dlock_elected`
//   (`<key>\n<announcement>`) into the observers' inboxes; statements in `sql.rs`'s
//   `ElectionStatements`
// - waiting in the lock's own server queue (a blocking `pg_advisory_lock` on a session of the
//   `waiting` pool, in `sql.rs`'s `wait_block`: a `DO` block that catches the lock timeout and
//   a cancel, so neither is logged; then `sql.rs`'s `claim` form of the acquisition; a dropped
//   wait's `leave`: `pg_cancel_backend` from a lock session, the conditional unlock behind the
//   block, the session kept): `turns.rs`; the `LISTEN`/re-check wait it falls
//   back on: `waiting.rs` + `listener.rs`
// - a full server lock table (`53200`) refused by name, never a lost session: `lock_table.rs`
// - held leases, clean-up: `held.rs`: owner token → session, key and `Hold` (plain, read, write;
//   `Intent` for a waiting writer's key); the reaper that unlocks a lease past its local deadline
//   (its wait, `backends/held_deadline.rs`, shared with ZooKeeper's); `unlock_in_background` /
//   `undo_in_background` (also what a dropped attempt's `Pending` or `RwHold` guard calls: the
//   unlocks go out on the same session behind the attempt)
// - renewal: `renew_rounds.rs` (`renew_in_rounds`, shared by locks, read-write leases and
//   permits: leases grouped by session, cut into statements of at most 1,000 leases and 128 KiB,
//   all sent at once), then `renew_plain.rs` (plain locks: the session's own `pg_locks` read once
//   per round), `rw.rs`'s `renew_rw_on`, `permits.rs`'s
//   `renew_permits_on` (one statement each; `renewed` and `forget` answer a lease alike for all
//   three); a statement that failed is answered by `failed_round` (`SessionExpired` for each lease
//   when the session ended, else the error)
// - operator's view: `inspect.rs` (`inspect`, `force_release`, `list` from the rows joined with
//   `pg_locks`)
// - read-write locks (`RwBackend`): `rw.rs`: two-`int4` advisory keys (a namespace apart from
//   plain locks' `bigint` ones): the lock, taken shared by readers and exclusively by writers, and
//   a writer-intent key that a waiting writer holds (readers take it shared for an instant first,
//   so they stay out behind a waiting writer); `RwHold` carries a waiting writer's intent and
//   session between attempts and undoes in the background what a dropped attempt may hold; a
//   read's fence is read by a second statement pipelined behind the grant; `renew_rw` checks the
//   session's own `pg_locks` rows (`objsubid` = 2); statements in `sql.rs`'s `RwStatements`
// - semaphores (`PermitBackend`): `permits.rs`: N `bigint` slot keys from a base and a
//   two-`int4` count marker held shared by every holder (`pg_locks` shows the stored count); one
//   statement takes the marker and the first free slot (`sql.rs`'s `PermitStatements`); one permit
//   or attempt per semaphore per session (a local reservation), so `free` lets go whatever the
//   session holds of it, which is also how a dropped attempt is undone (`PermitPending`); n
//   permits are n slots taken in the one statement behind a gate advisory lock, and waiters
//   queue for the gate in the server's lock queue (`permits_line.rs`, `turns.rs`'s `Queued`)
mod barrier;
mod barrier_sql;
mod channel_listens;
mod config;
mod election;
mod held;
mod inspect;
mod keys;
mod latch;
mod listener;
mod lock_backend;
mod lock_table;
mod permits;
mod permits_line;
mod pooler;
mod renew_plain;
mod renew_rounds;
mod retention;
mod rw;
mod session;
mod setup;
mod sql;
#[cfg(feature = "tls")]
mod tls;
mod tls_params;
mod turns;
mod waiting;

pub use self::election::MAX_VALUE_BYTES;
pub use self::keys::{advisory_key, advisory_key_in, rw_advisory_key, rw_advisory_key_in};

/// The `NOTIFY` channel of the latch `name` under `prefix` (see the
/// `latch` module): for the tests that look for its `LISTEN` on the server.
#[doc(hidden)]
pub fn latch_channel(prefix: &str, name: &str) -> String {
    latch::channel_of(prefix, name)
}

/// The per-statement pooler guard on the parameter `$n`, as every lock
/// statement carries it (`pooler.rs`): for the tests that run it through
/// a real pooler.
#[doc(hidden)]
pub fn pooler_guard_sql(n: u8) -> String {
    pooler::guard(n)
}

use crate::backends::sessions::pool::PooledSession;
use crate::backends::sessions::Sessions;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use self::config::Config;
use self::held::HeldMap;
use self::keys::digest;
use self::listener::{Listener, Waiters};
use self::session::Session;
use self::sql::Statements;
use crate::backend::transient::Transient;
use crate::LockError;

/// How often a waiter tries again when no release was announced.
const RECHECK: Duration = Duration::from_secs(1);

/// The PostgreSQL backend (see the module docs).
pub struct PostgresBackend {
    config: Config,
    /// The URL, password redacted.
    shown: String,
    statements: Statements,
    /// The sessions tries run on, and those waits queue on (`turns.rs`).
    sessions: Sessions<Session>,
    /// Keys whose try was refused lately (`turns.rs`).
    contended: turns::Contended,
    held: Arc<Mutex<HeldMap>>,
    waiters: Arc<Waiters>,
    /// Shared with the task that opens it (`waiting.rs`).
    listener: Arc<tokio::sync::Mutex<Option<Listener>>>,
    /// A session whose opening outlived its caller (an acquisition
    /// dropped meanwhile), kept for the next one that needs a session.
    spare: Arc<Mutex<Option<Arc<Session>>>>,
    /// Whether the leaders' table is known to exist (made on the first use
    /// of an election).
    leaders_ready: std::sync::atomic::AtomicBool,
    /// Whether the latches' table is known to exist (made on the first
    /// use of a latch).
    latches_ready: std::sync::atomic::AtomicBool,
    /// Whether the barriers' table is known to exist (made on the first
    /// use of a barrier).
    barriers_ready: std::sync::atomic::AtomicBool,
    /// The latches' and barriers' `LISTEN`s on the listening connection
    /// (`channel_listens.rs`).
    channel_listens: Arc<channel_listens::ChannelListens>,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
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
/// (a connection that failed, a server that did not answer or is shutting
/// down or starting) is marked so, and a waiting acquisition asks again
/// (`backend/transient.rs`).
pub(super) fn failed(shown: &str, e: impl Into<Failure>) -> LockError {
    let Failure { text, transient } = e.into();
    // A named prepared statement missing on the server session a statement
    // ran on: a transaction pooler moved the session (`pooler.rs`).
    if text.contains(&format!(" {}: ", pooler::NO_SUCH_STATEMENT))
        || text.contains(&format!(" {}: ", pooler::STATEMENT_EXISTS))
    {
        return pooler::refusal(shown, &text);
    }
    // A lock statement's guard failed: it ran on another server session
    // than its session's claimed one (`pooler.rs`).
    if text.contains(pooler::GUARD_MARK) {
        return pooler::refusal(
            shown,
            "a lock statement ran on another server session than the one its dlock session \
             claimed, so it did nothing; that server session was ended, freeing its locks",
        );
    }
    if transient {
        LockError::backend(shown, Transient::new(text))
    } else {
        LockError::backend(shown, text)
    }
}

/// The text of a failure: tokio-postgres's own `Display` of a server error
/// is only "db error", so the server's severity, code, message, detail and
/// hint are spelled out (none of them holds the password).
pub(super) struct Failure {
    pub(super) text: String,
    pub(super) transient: bool,
}

impl Failure {
    /// The server did not answer within `config.session.timeout`: `what` says what.
    pub(super) fn unanswered(what: String) -> Self {
        Failure {
            text: what,
            transient: true,
        }
    }
}

/// SQLSTATEs that pass: the connection failed (class 08), the server shuts
/// down, crashed or is starting (57P01-57P03), too many connections.
fn transient_state(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
}

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
            let transient = transient_state(db.code().code());
            return Failure { text, transient };
        }
        // No server error: the connection failed or closed.
        let mut transient = e.is_closed();
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            transient |= s.is::<std::io::Error>();
            let more = s.to_string();
            if !text.contains(&more) {
                text.push_str(&format!(": {more}"));
            }
            source = s.source();
        }
        Failure { text, transient }
    }
}

impl From<String> for Failure {
    fn from(text: String) -> Self {
        Failure {
            text,
            transient: false,
        }
    }
}

impl From<&str> for Failure {
    fn from(text: &str) -> Self {
        Failure::from(text.to_owned())
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
        let config = config::parse(url)?;
        let shown = crate::url::redact(url);
        let statements = Statements::new(&config.schema, config.session.fence_retention);
        let open_first = {
            let (config, statements, shown) = (config.clone(), statements.clone(), shown.clone());
            |alarm| async move { session::open(&config, &statements, &shown, true, alarm).await }
        };
        let (sessions, first) = Sessions::open(&config.session, open_first).await?;
        retention::sweep_if_due(&sessions.sweeper, &first, &statements.sweep, &shown);
        Ok(PostgresBackend {
            config,
            shown,
            statements,
            sessions,
            contended: turns::Contended::default(),
            held: Arc::new(Mutex::new(HeldMap::new())),
            waiters: Arc::new(Waiters::default()),
            listener: Arc::new(tokio::sync::Mutex::new(None)),
            spare: Arc::new(Mutex::new(None)),
            leaders_ready: std::sync::atomic::AtomicBool::new(false),
            latches_ready: std::sync::atomic::AtomicBool::new(false),
            barriers_ready: std::sync::atomic::AtomicBool::new(false),
            channel_listens: Arc::default(),
        })
    }

    /// How long the server lets a lock session be silent before it ends it
    /// and frees its locks (`?session_timeout=`): a frozen client's locks
    /// are free after about this long, and every lease's ttl is capped at it.
    pub fn session_timeout(&self) -> Duration {
        self.config.session.session_timeout
    }

    /// The fence table's name for `key`: `<prefix>:<key>`.
    fn name_of(&self, key: &str) -> String {
        format!("{}:{key}", self.config.prefix)
    }

    fn clamp(&self, ttl: Duration) -> Duration {
        ttl.min(self.config.session.session_timeout)
    }

    /// `fut` within the request timeout, its error the backend's.
    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.config.session.timeout, fut).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(failed(&self.shown, e)),
            Err(_) => Err(self.silent()),
        }
    }

    fn silent(&self) -> LockError {
        failed(
            &self.shown,
            Failure::unanswered(format!(
                "the server did not answer within {:?}",
                self.config.session.timeout
            )),
        )
    }

    /// Opens a lock session on dlock's background runtime, in a task of
    /// its own: a caller dropped meanwhile (a cancelled acquisition) does
    /// not cut the connection mid-setup (a wasted connection and a
    /// "connection reset" line in the server's log); the session is kept
    /// as the spare, and the next call takes it instead of opening one.
    async fn open_session(&self) -> Result<Arc<Session>, LockError> {
        if let Some(spare) = lock(&self.spare).take().filter(|s| s.is_alive()) {
            return Ok(spare);
        }
        let (config, statements, shown, alarm, spare) = (
            self.config.clone(),
            self.statements.clone(),
            self.shown.clone(),
            self.sessions.alarm.clone(),
            self.spare.clone(),
        );
        let (opened, heard) = tokio::sync::oneshot::channel();
        crate::lease::background::spawn(async move {
            let session = session::open(&config, &statements, &shown, false, alarm).await;
            if let Err(Ok(session)) = opened.send(session)
                && let Some(older) = lock(&spare).replace(session)
            {
                older.close();
            }
        });
        // Not sent: the task was dropped unrun (after `shutdown`).
        heard.await.unwrap_or(Err(LockError::ShutDown))
    }

    /// A live session for a read (inspect, list, force_release).
    async fn any_session(&self) -> Result<Arc<Session>, LockError> {
        let open = || self.open_session();
        self.sessions.any(open, &self.shown).await
    }
}
