//! Sessions: the connections that hold named locks, and the bounded pools
//! of them.
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
//! next request). A wait in the server's queue (`GET_LOCK` with a timeout)
//! whose caller leaves closes its session instead: the server takes it out
//! of the queue, and frees what it may have been granted.
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
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::config::Config;
use super::{failed, lock, Failure};
use crate::LockError;

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
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("alive", &self.is_alive())
            .field("names", &lock(&self.names).len())
            .finish()
    }
}

impl Session {
    pub(super) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Marks the session dead and rings the alarm (once).
    fn died(&self) {
        if self.alive.swap(false, Ordering::SeqCst) {
            self.alarm.send_modify(|generation| *generation += 1);
        }
    }

    /// Ends the session: its connection closes (behind any request in
    /// flight) and the server frees every lock it held.
    pub(super) fn close(self: &Arc<Self>) {
        self.died();
        let session = self.clone();
        crate::lease::background::spawn_daemon(async move {
            let conn = session.conn.lock().await.take();
            if let Some(conn) = conn {
                let _ = tokio::time::timeout(Duration::from_secs(1), conn.disconnect()).await;
            }
        });
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
    /// is dropped first: with `wait`, the session is closed at once (a wait
    /// in a server queue); otherwise the request finishes and `abandoned`
    /// says what to undo.
    pub(super) async fn call<T: Send + 'static>(
        self: &Arc<Self>,
        limit: Option<Duration>,
        wait: bool,
        op: Op<T>,
        abandoned: impl FnOnce(Option<&T>) -> Undo + Send + 'static,
    ) -> Result<T, Failure> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let session = self.clone();
        let task = async move { session.serve(tx, limit, wait, op, abandoned).await };
        if wait {
            crate::lease::background::spawn_daemon(task);
        } else {
            crate::lease::background::spawn(task);
        }
        match rx.await {
            Ok(mut parcel) => parcel.open(),
            Err(_) => Err(Failure {
                text: "dlock was shut down (`dlock::shutdown()`) before the request ran".into(),
                transient: false,
                broken: true,
            }),
        }
    }

    async fn serve<T: Send + 'static>(
        self: Arc<Self>,
        mut tx: tokio::sync::oneshot::Sender<Parcel<T>>,
        limit: Option<Duration>,
        wait: bool,
        op: Op<T>,
        abandoned: impl FnOnce(Option<&T>) -> Undo,
    ) {
        let mut guard = self.conn.lock().await;
        let Some(conn) = guard.as_mut() else {
            let undo = abandoned(None);
            let _ = tx.send(Parcel::new(Err(Failure::closed()), undo, &self));
            return;
        };
        let outcome = {
            let work = async {
                match limit {
                    Some(limit) => match tokio::time::timeout(limit, op(conn)).await {
                        Ok(answer) => answer.map_err(Failure::from),
                        Err(_) => Err(Failure::unanswered(limit)),
                    },
                    None => op(conn).await.map_err(Failure::from),
                }
            };
            if wait {
                tokio::select! {
                    answer = work => Some(answer),
                    () = tx.closed() => None,
                }
            } else {
                Some(work.await)
            }
        };
        let answer = match outcome {
            // The caller left a wait: closing the connection takes the
            // session out of the server's queue and frees any grant.
            None => {
                *guard = None;
                self.died();
                return;
            }
            Some(answer) => answer,
        };
        if answer.as_ref().is_err_and(|f| f.broken) {
            *guard = None;
            self.died();
        }
        let undo = abandoned(answer.as_ref().ok());
        // Delivered, the parcel undoes itself if the caller drops it unread.
        let Err(mut parcel) = tx.send(Parcel::new(answer, undo, &self)) else {
            return;
        };
        let Some(undo) = parcel.undo.take() else {
            return;
        };
        if let (Some(sql), Some(conn)) = (undo.sql, guard.as_mut()) {
            let done = tokio::time::timeout(Duration::from_secs(10), conn.query_drop(sql)).await;
            if !matches!(done, Ok(Ok(()))) {
                // Unknown: end the session, so the server frees its locks.
                *guard = None;
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
                    .call(Some(Duration::from_secs(10)), false, op, |_| {
                        Undo::default()
                    })
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

/// The slots of a pool: a session each, or none yet.
#[derive(Debug)]
pub(super) struct Pool {
    slots: Mutex<Vec<Option<Arc<Session>>>>,
    /// One connect at a time, so two acquisitions do not fill one slot twice.
    connecting: tokio::sync::Mutex<()>,
}

/// What [`Pool::reserve`] found.
pub(super) enum Reserved {
    /// The name is reserved on this session.
    On(Arc<Session>),
    /// Every session of the pool holds the name already (for this
    /// process's other leases): busy.
    Busy,
}

impl Pool {
    pub(super) fn new(size: usize) -> Self {
        Pool {
            slots: Mutex::new(vec![None; size]),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// Puts an opened session in the first empty or dead slot.
    pub(super) fn adopt(&self, session: Arc<Session>) {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots
            .iter_mut()
            .find(|s| s.as_ref().is_none_or(|s| !s.is_alive()))
        {
            *slot = Some(session);
        }
    }

    /// Reserves `name` on the least loaded session that does not have it
    /// (with `idle_only`, only on a session that holds nothing), opening a
    /// session in an empty (or dead) slot when that is the best. `name`
    /// `None`: any live session, nothing reserved.
    pub(super) async fn reserve<F, Fut>(
        &self,
        name: Option<&str>,
        idle_only: bool,
        open: F,
    ) -> Result<Reserved, LockError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Arc<Session>, LockError>>,
    {
        let size = lock(&self.slots).len();
        // Bounded: each round either returns or fills one slot.
        for _ in 0..=size {
            let empty = {
                let slots = lock(&self.slots);
                let mut best: Option<(usize, usize)> = None; // (load, index)
                for (i, slot) in slots.iter().enumerate() {
                    let load = match slot {
                        Some(s) if s.is_alive() => {
                            let has = lock(&s.names);
                            if name.is_some_and(|n| has.contains(n))
                                || (idle_only && !has.is_empty())
                            {
                                continue;
                            }
                            has.len()
                        }
                        _ => 0,
                    };
                    if best.is_none_or(|(l, _)| load < l) {
                        best = Some((load, i));
                    }
                }
                let Some((_, i)) = best else {
                    return Ok(Reserved::Busy);
                };
                match &slots[i] {
                    Some(s) if s.is_alive() => {
                        if let Some(name) = name {
                            s.reserve(name);
                        }
                        return Ok(Reserved::On(s.clone()));
                    }
                    _ => i,
                }
            };
            let _one = self.connecting.lock().await;
            let still_empty = lock(&self.slots)[empty]
                .as_ref()
                .is_none_or(|s| !s.is_alive());
            if still_empty {
                let session = open().await?;
                lock(&self.slots)[empty] = Some(session);
            }
        }
        Ok(Reserved::Busy)
    }

    /// Closes every session (the backend is dropped).
    pub(super) fn close_all(&self) {
        for s in lock(&self.slots).iter().flatten() {
            s.close();
        }
    }
}

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
    let limit = config.timeout;
    let wait_timeout = config.session_timeout.as_secs().max(1);
    let setup = async {
        let mut conn = Conn::new(config.opts.clone())
            .await
            .map_err(Failure::from)?;
        conn.query_drop(format!(
            "SET SESSION wait_timeout = {wait_timeout}, SESSION time_zone = '+00:00'"
        ))
        .await
        .map_err(Failure::from)?;
        Ok::<_, Failure>(conn)
    };
    let mut conn = match tokio::time::timeout(limit, setup).await {
        Ok(Ok(conn)) => conn,
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
    });
    crate::lease::background::spawn_daemon(ping(
        Arc::downgrade(&session),
        config.session_timeout / 3,
    ));
    tracing::debug!(id = session.id, "MySQL lock session opened");
    Ok(session)
}

/// Speaks on the session every third of the session timeout when nothing
/// else runs on it, so the server does not end a healthy session for
/// silence; a ping that fails ends the session (its locks are gone).
async fn ping(session: Weak<Session>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(s) = session.upgrade() else { return };
        if !s.is_alive() {
            return;
        }
        let Some(mut guard) = s.idle() else { continue };
        let Some(conn) = guard.as_mut() else { return };
        match tokio::time::timeout(every, conn.ping()).await {
            Ok(Ok(())) => {}
            _ => {
                tracing::debug!(id = s.id, "MySQL session ping failed; the session is gone");
                *guard = None;
                s.died();
                return;
            }
        }
    }
}
