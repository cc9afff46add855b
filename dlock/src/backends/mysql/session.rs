//! Sessions: the connections that hold named locks, pooled by
//! `backends/sessions/pool.rs`.
//!
//! A named lock belongs to a session, and `GET_LOCK` is re-entrant within
//! one (a second `GET_LOCK` of a name the session holds succeeds), so each
//! session keeps the set of names it holds or is asking for (reserved
//! before the request is sent): the backend never asks a session for a
//! name it already has, and a name held through every session is busy.
//!
//! A connection does one thing at a time, so every request runs as a task
//! of its own on dlock's background runtime ([`Session::call`]), in the
//! order the session's lock queues them: a caller that drops its future
//! does not cut a request in half. If the caller is gone when the answer
//! comes, the request's `abandoned` handler says what to undo (a grant
//! nobody will use is released at once, on the same session, before its
//! next request). A wait in the server's queue (`GET_LOCK` with a timeout,
//! [`Session::wait_then`], `session/queue_wait.rs`) whose caller leaves is
//! ended with `KILL QUERY` from a lock session, its answer read and what it
//! may have been granted let go (`cancel.rs`): the session stays, idle in
//! its pool (closed only if that fails).
//!
//! A session ends when a request finds its connection broken (the server
//! killed it, a restart, a network failure), or times out, or when the
//! backend closes it; it is then dead for good, the leases it carried are
//! lost (the backend's loss alarm rings), and its slot is filled by a new
//! session at the next acquisition.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::config::Config;
use super::{failed, lock, Failure};
use crate::backends::sessions::pool::{self as session_pool, PooledSession};
use crate::LockError;

mod queue_wait;

pub(super) use queue_wait::{Cancel, Then};

/// One request: what it does with the connection.
pub(super) type Op<T> = Box<
    dyn for<'c> FnOnce(
            &'c mut Conn,
        )
            -> Pin<Box<dyn Future<Output = Result<T, mysql_async::Error>> + Send + 'c>>
        + Send,
>;

/// What to do when a request's caller left before its answer: a statement
/// to run on the session (a grant to give back) and a name to forget there.
#[derive(Debug, Default)]
pub(super) struct Undo {
    pub(super) sql: Option<String>,
    pub(super) forget: Option<String>,
}

/// One connection holding locks.
pub(super) struct Session {
    /// `None` once the connection is closed.
    conn: tokio::sync::Mutex<Option<Conn>>,
    /// The server's id of the connection (`CONNECTION_ID()`, what
    /// `IS_USED_LOCK` answers and `KILL` takes).
    pub(super) id: u32,
    /// Lock names held (or asked for) through this session.
    names: Mutex<HashSet<String>>,
    /// False once the connection has ended or [`close`](Self::close) ran.
    alive: AtomicBool,
    /// Rung when the session ends (see `LockBackend::loss_alarm`).
    alarm: Arc<tokio::sync::watch::Sender<u64>>,
    /// The session's lifeline (`lifeline.rs`): its name, and how the
    /// watcher connects; the watcher starts with the first lease.
    lifeline: String,
    opts: mysql_async::Opts,
    watched: AtomicBool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        session_pool::debug(self, "id", &self.id, f)
    }
}

impl Session {
    /// Marks the session dead and rings the alarm (once).
    fn died(&self) {
        if self.alive.swap(false, Ordering::SeqCst) {
            self.alarm.send_modify(|generation| *generation += 1);
        }
    }

    /// Starts the watcher of the session's lifeline, once: called when the
    /// session carries a lease, so that its end is heard at once.
    pub(super) fn watch(self: &Arc<Self>) {
        if self.watched.swap(true, Ordering::SeqCst) {
            return;
        }
        crate::lease::background::spawn_daemon(super::lifeline::watch(
            Arc::downgrade(self),
            self.id,
            self.opts.clone(),
            self.lifeline.clone(),
        ));
    }

    /// Notes `name` as held (or asked for) through this session.
    pub(super) fn reserve(&self, name: &str) {
        lock(&self.names).insert(name.to_owned());
    }

    /// Forgets `name`: no longer held through this session.
    pub(super) fn unreserve(&self, name: &str) {
        lock(&self.names).remove(name);
    }

    /// Runs `op` on the connection, in a task of its own on dlock's
    /// background runtime, behind the session's earlier requests; at most
    /// `limit` (then the session is closed: a request that does not answer
    /// leaves the connection in an unknown state). If the caller's future
    /// is dropped first, the request finishes and `abandoned` says what to
    /// undo. (A wait in a server queue, which a caller's leaving ends at
    /// once, is [`wait_then`](Self::wait_then).)
    pub(super) async fn call<T: Send + 'static>(
        self: &Arc<Self>,
        limit: Option<Duration>,
        op: Op<T>,
        abandoned: impl FnOnce(Option<&T>) -> Undo + Send + 'static,
    ) -> Result<T, Failure> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let session = self.clone();
        crate::lease::background::spawn(async move {
            session.serve(tx, limit, op, abandoned).await;
        });
        opened(rx).await
    }

    /// Runs `op`, a statement that lets `name` go, within `limit`, behind
    /// the session's earlier requests: if the caller leaves before the
    /// answer, `name` is forgotten on the session all the same.
    pub(super) async fn call_letting_go<T: Send + 'static>(
        self: &Arc<Self>,
        limit: Duration,
        name: &str,
        op: Op<T>,
    ) -> Result<T, Failure> {
        let forget = name.to_owned();
        let abandoned = move |_: Option<&T>| Undo {
            sql: None,
            forget: Some(forget),
        };
        self.call(Some(limit), op, abandoned).await
    }

    async fn serve<T: Send + 'static>(
        self: Arc<Self>,
        tx: tokio::sync::oneshot::Sender<Parcel<T>>,
        limit: Option<Duration>,
        op: Op<T>,
        abandoned: impl FnOnce(Option<&T>) -> Undo,
    ) {
        let mut guard = self.conn.lock().await;
        let answer = match guard.as_mut() {
            Some(conn) => bounded(limit, op(conn)).await,
            None => Err(Failure::closed()),
        };
        self.deliver(&mut guard, tx, answer, abandoned).await;
    }

    /// Hands `answer` to its caller. A broken connection ends the session;
    /// an answer whose caller left is undone here, as `abandoned` says,
    /// before the session's next request.
    async fn deliver<T>(
        self: &Arc<Self>,
        guard: &mut tokio::sync::MutexGuard<'_, Option<Conn>>,
        tx: tokio::sync::oneshot::Sender<Parcel<T>>,
        answer: Result<T, Failure>,
        abandoned: impl FnOnce(Option<&T>) -> Undo,
    ) {
        if answer.as_ref().is_err_and(|f| f.broken) {
            **guard = None;
            self.died();
        }
        let undo = abandoned(answer.as_ref().ok());
        // Delivered, the parcel undoes itself if the caller drops it unread.
        let Err(mut parcel) = tx.send(Parcel::new(answer, undo, self)) else {
            return;
        };
        let Some(undo) = parcel.undo.take() else {
            return;
        };
        if let (Some(sql), Some(conn)) = (undo.sql, guard.as_mut()) {
            let done = tokio::time::timeout(Duration::from_secs(10), conn.query_drop(sql)).await;
            if !matches!(done, Ok(Ok(()))) {
                // Unknown: end the session, so the server frees its locks.
                **guard = None;
                self.died();
            }
        }
        if let Some(name) = undo.forget {
            self.unreserve(&name);
        }
    }

    /// Whether nothing runs on the session now (then a ping may go).
    fn idle(&self) -> Option<tokio::sync::MutexGuard<'_, Option<Conn>>> {
        self.conn.try_lock().ok()
    }
}

/// A request's answer on its way to the caller, with what undoes it: if
/// the caller's future is dropped after the answer was sent but before it
/// was read, the parcel is dropped unopened and undoes the request in the
/// background, on its session.
pub(super) struct Parcel<T> {
    answer: Option<Result<T, Failure>>,
    undo: Option<Undo>,
    session: Arc<Session>,
}

impl<T> Parcel<T> {
    fn new(answer: Result<T, Failure>, undo: Undo, session: &Arc<Session>) -> Self {
        Parcel {
            answer: Some(answer),
            undo: Some(undo),
            session: session.clone(),
        }
    }

    /// The answer; nothing is undone.
    fn open(&mut self) -> Result<T, Failure> {
        self.undo = None;
        self.answer.take().unwrap_or_else(|| Err(Failure::closed()))
    }
}

impl<T> Drop for Parcel<T> {
    fn drop(&mut self) {
        let Some(undo) = self.undo.take() else { return };
        if undo.sql.is_none() && undo.forget.is_none() {
            return;
        }
        let session = self.session.clone();
        crate::lease::background::spawn(async move {
            let Undo { sql, forget } = undo;
            if let Some(sql) = sql {
                let op: Op<()> = Box::new(move |conn| Box::pin(conn.query_drop(sql)));
                if session
                    .call(Some(Duration::from_secs(10)), op, |_| Undo::default())
                    .await
                    .is_err()
                {
                    session.close();
                }
            }
            if let Some(name) = forget {
                session.unreserve(&name);
            }
        });
    }
}

impl PooledSession for Session {
    type Key = String;

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn keys(&self) -> &Mutex<HashSet<String>> {
        &self.names
    }

    /// Ends the session: its connection closes (behind any request in
    /// flight) and the server frees every lock it held.
    fn close(self: &Arc<Self>) {
        self.died();
        let session = self.clone();
        crate::lease::background::spawn_daemon(async move {
            let conn = session.conn.lock().await.take();
            if let Some(conn) = conn {
                let _ = tokio::time::timeout(Duration::from_secs(1), conn.disconnect()).await;
            }
        });
    }

    /// When nothing else runs on the session (then that speaks); a ping
    /// that fails ends the session (its locks are gone).
    async fn ping(&self, within: Duration) -> bool {
        let Some(mut guard) = self.idle() else {
            return true;
        };
        let Some(conn) = guard.as_mut() else {
            return false;
        };
        if matches!(tokio::time::timeout(within, conn.ping()).await, Ok(Ok(()))) {
            return true;
        }
        tracing::debug!(
            id = self.id,
            "MySQL session ping failed; the session is gone"
        );
        *guard = None;
        self.died();
        false
    }
}

/// The answer a request's task sends, opened; a task that never ran
/// (dlock shut down first) is a broken request.
async fn opened<T>(rx: tokio::sync::oneshot::Receiver<Parcel<T>>) -> Result<T, Failure> {
    match rx.await {
        Ok(mut parcel) => parcel.open(),
        Err(_) => Err(Failure {
            text: "dlock was shut down (`dlock::shutdown()`) before the request ran".into(),
            transient: false,
            broken: true,
        }),
    }
}

/// `work`'s answer within `limit`: past it, the request is unanswered
/// (and the connection broken).
async fn bounded<T>(
    limit: Option<Duration>,
    work: impl Future<Output = Result<T, mysql_async::Error>>,
) -> Result<T, Failure> {
    match limit {
        Some(limit) => match tokio::time::timeout(limit, work).await {
            Ok(answer) => answer.map_err(Failure::from),
            Err(_) => Err(Failure::unanswered(limit)),
        },
        None => work.await.map_err(Failure::from),
    }
}

/// What [`Pool::reserve`](session_pool::Pool::reserve) found.
pub(super) type Reserved = session_pool::Reserved<Session>;

/// Opens one session: connects within the timeout, sets the server's
/// `wait_timeout` (it ends the session, freeing its locks, when this client
/// is silent that long: a frozen or vanished client) and UTC for the
/// fences' clock, and starts its pinger. Run on dlock's background runtime.
pub(super) async fn open(
    config: &Config,
    shown: &str,
    alarm: Arc<tokio::sync::watch::Sender<u64>>,
    first: Option<&super::sql::Statements>,
) -> Result<Arc<Session>, LockError> {
    let limit = config.session.timeout;
    let wait_timeout = config.session.session_timeout.as_secs().max(1);
    let setup = async {
        let mut conn = Conn::new(config.opts.clone())
            .await
            .map_err(Failure::from)?;
        conn.query_drop(format!(
            "SET SESSION wait_timeout = {wait_timeout}, SESSION time_zone = '+00:00'"
        ))
        .await
        .map_err(Failure::from)?;
        let lifeline = super::lifeline::name(&config.prefix, conn.id());
        if !super::lifeline::taken(&mut conn, &lifeline)
            .await
            .map_err(Failure::from)?
        {
            return Err(Failure::from(format!(
                "the session's lifeline lock `{lifeline}` is held by another session: SQL code must not take names under `{}:#`",
                config.prefix
            )));
        }
        Ok::<_, Failure>((conn, lifeline))
    };
    let (mut conn, lifeline) = match tokio::time::timeout(limit, setup).await {
        Ok(Ok(opened)) => opened,
        Ok(Err(e)) => return Err(failed(shown, super::tls::explained(e))),
        Err(_) => {
            return Err(failed(
                shown,
                Failure {
                    text: format!("connecting did not finish within {limit:?}"),
                    transient: true,
                    broken: true,
                },
            ))
        }
    };
    if let Some(statements) = first {
        let checks = super::setup::ensure_table(&mut conn, &config.database, statements, shown);
        match tokio::time::timeout(limit, checks).await {
            Ok(done) => done?,
            Err(_) => return Err(failed(shown, Failure::unanswered(limit))),
        }
    }
    let session = Arc::new(Session {
        id: conn.id(),
        conn: tokio::sync::Mutex::new(Some(conn)),
        names: Mutex::new(HashSet::new()),
        alive: AtomicBool::new(true),
        alarm,
        lifeline,
        opts: config.opts.clone(),
        watched: AtomicBool::new(false),
    });
    crate::lease::background::spawn_daemon(session_pool::keep_alive(
        Arc::downgrade(&session),
        config.session.session_timeout / 3,
    ));
    tracing::debug!(id = session.id, "MySQL lock session opened");
    Ok(session)
}
