//! Sessions: the connections that hold advisory locks, pooled by
//! `backends/sessions/pool.rs` (advisory locks belong to a session, and are
//! reentrant within it, so each session keeps the set of advisory keys it
//! holds or is asking for). A session ends when its connection closes (the server terminated it, a
//! restart, a network failure) or when the backend closes it; it is then
//! dead for good, its leases are lost, and its slot is filled by a new
//! session at the next acquisition.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::{Client, Statement};

use super::config::Config;
use super::sql::Statements;
use super::{failed, lock, Failure};
use crate::backends::sessions::pool::{self as session_pool, PooledSession};
use crate::LockError;

/// How often a waiting server process checks that its client is still
/// there (`client_connection_check_interval`, in ms, set on every
/// session: the check's timer starts with a statement, so setting it in
/// the waiting statement itself would be too late).
const CHECK_CLIENT_MS: u32 = 1000;

/// One connection holding locks.
pub(super) struct Session {
    pub(super) client: Client,
    /// The prepared statements of this connection.
    pub(super) prepared: Prepared,
    /// Advisory keys held (or asked for) through this session.
    held: Mutex<HashSet<i64>>,
    /// False once the connection has ended, or [`close`](Self::close) ran.
    alive: Arc<AtomicBool>,
    /// Ends the connection task, so the server frees the session's locks.
    closing: Arc<Notify>,
    /// The server process id of the session, for operators (`pg_locks.pid`).
    pub(super) pid: i32,
    /// The claim token every guarded statement passes (`pooler.rs`).
    pub(super) token: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        session_pool::debug(self, "pid", &self.pid, f)
    }
}

/// The statements every lock session runs, prepared once.
pub(super) struct Prepared {
    pub(super) acquire: Statement,
    pub(super) claim: Statement,
    pub(super) cancel: Statement,
    pub(super) renew: Statement,
    pub(super) own_locks: Statement,
    pub(super) release: Statement,
    pub(super) unlock: Statement,
    /// The read-write lock statements (see `sql.rs`).
    pub(super) rw: RwPrepared,
    /// The semaphore statements (see `sql.rs`).
    pub(super) permits: PermitPrepared,
}

/// The semaphore statements of a session, prepared once.
pub(super) struct PermitPrepared {
    pub(super) take: Statement,
    pub(super) free: Statement,
    pub(super) renew: Statement,
    pub(super) gate_held: Statement,
    pub(super) taken: Statement,
}

/// The read-write lock statements of a session, prepared once.
pub(super) struct RwPrepared {
    pub(super) read: Statement,
    pub(super) fence: Statement,
    pub(super) write: Statement,
    pub(super) unlock: Statement,
    pub(super) unlock_shared: Statement,
    pub(super) renew: Statement,
}

impl Session {
    /// How many keys are held (or asked for) through this session.
    pub(super) fn load(&self) -> usize {
        lock(&self.held).len()
    }

    /// Runs a guarded statement's `answer`: a failed guard (`pooler.rs`)
    /// retires the session (its claimed server session was ended by the
    /// guard itself).
    pub(super) async fn guarded<T>(
        &self,
        answer: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, tokio_postgres::Error> {
        let answer = answer.await;
        if let Err(e) = &answer
            && super::pooler::is_guard_refusal(e)
        {
            tracing::warn!(
                pid = self.pid,
                "a lock statement's pooler guard failed: session retired"
            );
            self.alive.store(false, Ordering::SeqCst);
            self.closing.notify_one();
        }
        answer
    }

    /// Forgets `key`: no longer held through this session.
    pub(super) fn unreserve(&self, key: i64) {
        lock(&self.held).remove(&key);
    }
}

impl PooledSession for Session {
    type Key = i64;

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && !self.client.is_closed()
    }

    fn keys(&self) -> &Mutex<HashSet<i64>> {
        &self.held
    }

    /// Its connection closes and the server frees every lock it held.
    fn close(self: &Arc<Self>) {
        self.alive.store(false, Ordering::SeqCst);
        self.closing.notify_one();
    }

    /// A failed ping is only logged: the connection's own end (its task)
    /// is what marks the session dead.
    async fn ping(&self, within: Duration) -> bool {
        let ping = self.client.batch_execute("SELECT 1");
        if let Ok(Err(e)) = tokio::time::timeout(within, ping).await {
            tracing::debug!(pid = self.pid, error = %e, "PostgreSQL session ping failed");
        }
        true
    }
}

/// What [`Pool::reserve`](session_pool::Pool::reserve) found.
pub(super) type Reserved = session_pool::Reserved<Session>;

/// Opens one lock session: connects, pins its `search_path` to the
/// system's schema (`setup.rs`), sets the server's timeouts that free
/// its locks when this client goes silent, prepares the statements, and
/// starts its pinger; `alarm` is raised when the session ends. The `first`
/// session of a backend also checks the
/// server is a primary and creates the fence table if missing. Run on
/// dlock's background runtime.
pub(super) async fn open(
    config: &Config,
    statements: &Statements,
    shown: &str,
    first: bool,
    alarm: Arc<tokio::sync::watch::Sender<u64>>,
) -> Result<Arc<Session>, LockError> {
    let (client, connection) = connect(config, shown).await?;
    let t = config.session.session_timeout;
    let third_secs = (t.as_secs() / 3).max(1);
    // The server ends the session when the client sends nothing for
    // `session_timeout` (a frozen or vanished client; the pinger below
    // speaks every third of it), and its TCP keepalives and user timeout
    // notice a dead peer in about the same time. A statement that waits
    // (`turns.rs`) checks every second that its client is still there, so
    // a killed waiter leaves the lock's queue.
    // A role's or database's defaults (`ALTER ROLE … SET statement_timeout`)
    // must not cut dlock's waits nor end its idle sessions: dlock bounds its
    // own statements (`lock_timeout` per wait, `turns.rs`), so the others
    // are switched off; a session may always set them for itself.
    let settings = format!(
        "{pin}; SET idle_session_timeout = {ms}; SET tcp_user_timeout = {ms}; \
         SET tcp_keepalives_idle = {third_secs}; SET tcp_keepalives_interval = {third_secs}; \
         SET tcp_keepalives_count = 3; SET client_connection_check_interval = {check_ms}; \
         SET statement_timeout = 0; SET lock_timeout = 0; \
         SET idle_in_transaction_session_timeout = 0",
        check_ms = CHECK_CLIENT_MS,
        pin = super::setup::PIN_SEARCH_PATH,
        ms = t.as_millis(),
    );
    let closing = Arc::new(Notify::new());
    let alive = Arc::new(AtomicBool::new(true));
    let (task_alive, task_closing) = (alive.clone(), closing.clone());
    // The connection task lives on the runtime this runs on (the background
    // one); ending it (the connection closed, or `close`) closes the socket.
    tokio::spawn(async move {
        tokio::select! {
            _ = connection => {}
            () = task_closing.notified() => {}
        }
        task_alive.store(false, Ordering::SeqCst);
        // Its advisory locks are gone with it: the watchdog renews now, so
        // their leases are reported lost at once, not at their next renewal.
        alarm.send_modify(|generation| *generation += 1);
    });
    let setup = async {
        // Before any lock and any named prepared statement: a
        // transaction pooler is refused here (`pooler.rs`).
        let (pid, token) = super::pooler::claim(&client, &settings, shown).await?;
        let (probe, probe_connection) = connect(config, shown).await?;
        let probe_task = tokio::spawn(probe_connection);
        let probed = super::pooler::probe(&probe, config, shown, pid).await;
        drop(probe);
        probe_task.abort();
        probed?;
        if first {
            super::setup::check_server(&client, config, shown).await?;
            super::setup::ensure_table(&client, config, statements, shown).await?;
        }
        let (acquire, claim, cancel, renew, own_locks, release, unlock) = tokio::try_join!(
            client.prepare(&statements.acquire),
            client.prepare(&statements.claim),
            client.prepare(&statements.cancel),
            client.prepare(&statements.renew),
            client.prepare(&statements.own_locks),
            client.prepare(&statements.release),
            client.prepare(&statements.unlock),
        )
        .map_err(|e| failed(shown, e))?;
        let rw = &statements.rw;
        let (read, fence, write, rw_unlock, unlock_shared, rw_renew) = tokio::try_join!(
            client.prepare(&rw.read),
            client.prepare(&rw.fence),
            client.prepare(&rw.write),
            client.prepare(&rw.unlock),
            client.prepare(&rw.unlock_shared),
            client.prepare(&rw.renew),
        )
        .map_err(|e| failed(shown, e))?;
        let (take, free, permit_renew, gate_held, taken) = tokio::try_join!(
            client.prepare(&statements.permits.take),
            client.prepare(&statements.permits.free),
            client.prepare(&statements.permits.renew),
            client.prepare(&statements.permits.gate_held),
            client.prepare(&statements.permits.taken),
        )
        .map_err(|e| failed(shown, e))?;
        Ok::<_, LockError>((
            Prepared {
                acquire,
                claim,
                cancel,
                renew,
                own_locks,
                release,
                unlock,
                rw: RwPrepared {
                    read,
                    fence,
                    write,
                    unlock: rw_unlock,
                    unlock_shared,
                    renew: rw_renew,
                },
                permits: PermitPrepared {
                    take,
                    free,
                    renew: permit_renew,
                    gate_held,
                    taken,
                },
            },
            pid,
            token,
        ))
    };
    let (prepared, pid, token) = match tokio::time::timeout(config.session.timeout, setup).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(failed(
                shown,
                Failure::unanswered(format!(
                    "a new session's setup did not answer within {:?}",
                    config.session.timeout
                )),
            ))
        }
    };
    let session = Arc::new(Session {
        client,
        prepared,
        held: Mutex::new(HashSet::new()),
        alive,
        closing,
        pid,
        token,
    });
    tokio::spawn(session_pool::keep_alive(Arc::downgrade(&session), t / 3));
    tracing::debug!(pid, "PostgreSQL lock session opened");
    Ok(session)
}

/// The stream under a connection: TLS or plain, as the server and
/// `sslmode` decided.
#[cfg(feature = "tls")]
type TlsStream =
    <super::tls::Connector as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream;
#[cfg(not(feature = "tls"))]
type TlsStream = tokio_postgres::tls::NoTlsStream;

/// A connection's task half, as [`connect`] returns it.
pub(super) type Connection = tokio_postgres::Connection<tokio_postgres::Socket, TlsStream>;

/// tokio-postgres's settings for one connection: the URL's, with TCP
/// keep-alive after a third of the session timeout and a user timeout of
/// the session timeout where the URL set neither (its own `tcp_keepalive=`,
/// or libpq's `keepalives`, `keepalives_idle`, `tcp_user_timeout`).
pub(super) fn client_config(config: &Config) -> tokio_postgres::Config {
    let mut pg = config.pg.clone();
    if !config.keepalive_given {
        let third = config.session.session_timeout / 3;
        pg.keepalives(true)
            .keepalives_idle(third.max(Duration::from_secs(1)));
    }
    if !config.user_timeout_given {
        pg.tcp_user_timeout(config.session.session_timeout);
    }
    pg
}

/// Connects within the connect timeout, with the client's keepalives on,
/// over TLS as the URL's `sslmode` says (every connection of a backend:
/// lock sessions and the listener).
pub(super) async fn connect(
    config: &Config,
    shown: &str,
) -> Result<(Client, Connection), LockError> {
    let pg = client_config(config);
    let limit = *pg.get_connect_timeout().unwrap_or(&config.session.timeout);
    #[cfg(feature = "tls")]
    let tls = config.connector.clone();
    #[cfg(not(feature = "tls"))]
    let tls = tokio_postgres::NoTls;
    match tokio::time::timeout(limit + Duration::from_millis(100), pg.connect(tls)).await {
        Ok(Ok(pair)) => Ok(pair),
        Ok(Err(e)) => Err(failed(shown, with_tls_hint(e.into()))),
        Err(_) => Err(failed(
            shown,
            Failure::unanswered(format!("connecting did not finish within {limit:?}")),
        )),
    }
}

/// A failed connection's text, with what to do about a TLS failure.
fn with_tls_hint(failure: Failure) -> Failure {
    let Failure { text, transient } = failure;
    let hint = if text.contains("server does not support TLS") {
        "the server offers no TLS here: turn `ssl = on` in its postgresql.conf; over a Unix socket, which never has TLS, or on a trusted network only, connect with `sslmode=prefer` or `disable`"
    } else if text.contains("not valid for name") {
        "the server's certificate does not name the host dlock connected to: connect by a name (or address) the certificate holds, or have the server's certificate issued for the name you connect to"
    } else if text.contains("invalid peer certificate") {
        "the server's certificate is not signed by a CA of `sslrootcert` (without it, of Mozilla's roots), or is expired or not for a server"
    } else {
        return Failure { text, transient };
    };
    // A certificate that does not fit does not pass by asking again.
    Failure {
        text: format!("{text} ({hint})"),
        transient: false,
    }
}
