//! Waiting in turn: a waiting acquisition waits in the server's own queue
//! of the advisory lock (`pg_advisory_lock`, a blocking call) on a
//! connection of its own, so that waiters of every process, and SQL
//! clients' `pg_advisory_lock` on the same key, are served in arrival
//! order; a release wakes exactly the next waiter (the server's lock
//! manager grants it the lock inside the unlock), and no waiter re-checks.
//!
//! - The first attempt is the ordinary `pg_try_advisory_lock` on a lock
//!   session (an uncontended acquisition costs what it did), unless a try
//!   of this key was refused in the last second: the waiting statement,
//!   which a free lock grants at once, then goes first, which saves the
//!   try's round trip and transaction on a contended key and puts the
//!   waiter in the queue one round trip after it asked.
//! - Refused, the waiter takes an idle *waiting session* (a second pool of
//!   at most `?sessions=` connections, opened when first needed; a session
//!   qualifies when nothing is held or asked through it) and sends the
//!   waiting statement there: a `DO` block whose `pg_advisory_lock` waits
//!   in the queue and which ends without an error when granted, out of
//!   time or cancelled (`sql.rs`'s `wait_block`: PL/pgSQL catches the
//!   cancel and the lock timeout, and a caught error is not logged); then
//!   the claim, which finds the lock among the session's own and writes
//!   the fence and holder row. The session's lock then carries the lease,
//!   as a lock session's does; released, the session is idle again.
//! - The deadline is the block's `lock_timeout` (local to it): the server
//!   takes the waiter out of the queue when it passes, quietly.
//! - An acquisition dropped while it waits leaves the queue at once
//!   ([`leave`]): a lock session sends `pg_cancel_backend` for the waiting
//!   session's server process while it waits for an advisory lock (again
//!   every 50 ms until the block has ended, in case it queued after the
//!   look), then the waiting session lets go of the lock if it was granted
//!   in the race (an unlock that asks first, so the server logs no "you
//!   don't own a lock") and is free for the next wait. No connection is
//!   opened or closed, and the server logs nothing: 1,000 waits cancelled
//!   in the queue left no waiter 100 ms after each cancel, no new
//!   connection and no log line (`tests/tests/postgres_cancelled_waits.rs`).
//!   Only without a live lock session to cancel from, or a wait that does
//!   not end within 10 s, is the waiting session closed instead.
//! - A waiter whose process dies leaves the queue as soon as its server
//!   process notices: within `client_connection_check_interval` (1 s on
//!   dlock's sessions), or at once when its turn comes (it is granted the
//!   lock, cannot answer, and ends, which frees it).
//! - With no idle waiting session (more waits at once than `?sessions=`),
//!   a waiter falls back to re-trying when a release is announced
//!   (`NOTIFY`) and every second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;

use super::session::Session;
use super::{advisory_key_in, failed, lock, sql, PostgresBackend};
use crate::backend::{AcquireRequest, Lease};
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// How long after a refused try a key's acquisitions wait in line at once.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// The most keys [`Contended`] remembers.
const MAX_CONTENDED: usize = 1024;

/// The keys whose try this backend saw refused lately, and when.
#[derive(Debug, Default)]
pub(super) struct Contended(Mutex<HashMap<i64, Instant>>);

impl Contended {
    fn recently(&self, key: i64) -> bool {
        lock(&self.0)
            .get(&key)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    fn mark(&self, key: i64) {
        let mut keys = lock(&self.0);
        if keys.len() >= MAX_CONTENDED && !keys.contains_key(&key) {
            keys.retain(|_, at| at.elapsed() < CONTENDED_FOR);
            if keys.len() >= MAX_CONTENDED {
                return;
            }
        }
        keys.insert(key, Instant::now());
    }
}

/// A wait in the lock's queue: if dropped before its answer is read, it
/// leaves the queue at once ([`leave`]) and its waiting session is kept;
/// with no lock session to cancel from, the waiting session is closed
/// (which takes it out of the queue too, with a log line or two).
pub(super) struct Queued {
    pub(super) session: Option<Arc<Session>>,
    pub(super) key: i64,
    /// What the wait reserves on its session (`key` for a lock's wait).
    pub(super) reserved: i64,
    /// A lock session (never blocked by a wait) to cancel from.
    pub(super) canceller: Option<Arc<Session>>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        match self.canceller.take() {
            Some(canceller) if canceller.is_alive() && session.is_alive() => {
                crate::lease::background::spawn(leave(canceller, session, self.key, self.reserved));
            }
            _ => session.close(),
        }
    }
}

/// How long a dropped wait may take to leave the queue before its
/// waiting session is closed instead.
const LEAVE_WITHIN: Duration = Duration::from_secs(10);

/// How often a dropped wait's statement is cancelled again while it has
/// not ended: the wait may have reached the queue only after the last
/// cancel looked.
const CANCEL_AGAIN: Duration = Duration::from_millis(50);

/// Takes the dropped wait of `key` on `session` out of the server's queue:
/// its statement is cancelled from `canceller` (only while it waits for
/// an advisory lock: the wait block catches the cancel, so nothing is
/// logged and the session stays usable), then, behind it on `session`,
/// the lock is let go if it was granted meanwhile, and the session is free
/// for the next wait (`reserved` let go on it). No connection is opened or closed, unless the wait
/// does not end within [`LEAVE_WITHIN`]: then the session is closed.
async fn leave(canceller: Arc<Session>, session: Arc<Session>, key: i64, reserved: i64) {
    let pid = [&session.pid as &(dyn tokio_postgres::types::ToSql + Sync)];
    let cancel = || async {
        let sent = canceller.client.query_one(&canceller.prepared.cancel, &pid);
        // Not answered: looked for again at the next round.
        let _ = tokio::time::timeout(Duration::from_secs(1), sent).await;
    };
    cancel().await;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&key, &session.token];
    let unlock = session.guarded(session.client.query_one(&session.prepared.unlock, &params));
    let mut unlock = std::pin::pin!(unlock);
    let start = Instant::now();
    loop {
        tokio::select! {
            answer = &mut unlock => {
                match answer {
                    Ok(_) => session.unreserve(reserved),
                    // Refused at the announcement, after the unlock.
                    Err(e) if super::lock_table::is_full(&e) => session.unreserve(reserved),
                    Err(_) => session.close(),
                }
                return;
            }
            () = tokio::time::sleep(CANCEL_AGAIN) => {
                if start.elapsed() >= LEAVE_WITHIN || !session.is_alive() {
                    session.close();
                    return;
                }
                cancel().await;
            }
        }
    }
}

impl PostgresBackend {
    /// `acquire`: a try, then a wait in the lock's queue (see the module
    /// docs), or the re-checking wait when no waiting session is idle.
    pub(super) async fn acquire_in_turn(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let key = advisory_key_in(&self.config.prefix, &req.key);
        if !self.contended.recently(key)
            && let Some(lease) = self.try_once(req).await?
        {
            return Ok(Some(lease));
        }
        self.contended.mark(key);
        if let Some(session) = self.idle_waiting_session(key).await {
            return self.wait_in_line(session, key, req, deadline).await;
        }
        self.wait_for(key, deadline, &mut (self, req), |(backend, req)| {
            Box::pin(backend.try_once(req))
        })
        .await
    }

    /// Waits for `key` in the server's queue on `session` (idle, `key`
    /// reserved on it) until `deadline`: the wait block, then the claim.
    async fn wait_in_line(
        &self,
        session: Arc<Session>,
        key: i64,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let limit_ms: u128 = match deadline {
            None => 0,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    session.unreserve(key);
                    return Ok(None);
                }
                left.as_millis().clamp(1, i32::MAX as u128)
            }
        };
        let Some(block) = sql::wait_block(key, limit_ms, &session.token) else {
            session.unreserve(key);
            return Err(failed(
                &self.shown,
                "a session's claim token is not of dlock's form",
            ));
        };
        let mut queued = Queued {
            session: Some(session.clone()),
            key,
            reserved: key,
            canceller: self.sessions.pool.live(),
        };
        let statement = session.guarded(session.client.batch_execute(&block));
        let answer = match deadline {
            // The server ends the wait at the deadline; past it by the
            // request timeout, it is silent.
            Some(d) => {
                let silent_at = d + self.config.session.timeout;
                match tokio::time::timeout_at(silent_at.into(), statement).await {
                    Ok(answer) => answer,
                    Err(_) => return Err(self.silent()),
                }
            }
            // No limit: the session's keepalives notice a dead server.
            None => statement.await,
        };
        match answer {
            Ok(()) => {}
            // A full lock table: nothing granted, but the unlock behind it
            // (`queued`'s drop) makes sure.
            Err(e) if e.code() == Some(&SqlState::OUT_OF_MEMORY) => {
                return Err(self.lock_table_full());
            }
            // Unknown: `queued`'s drop cancels what may still wait, and
            // lets go of what may have been granted.
            Err(e) => return Err(failed(&self.shown, e)),
        }
        // The block ended, granted or out of time; the claim says which
        // (and, granted, writes the fence and the holder row). The ttl
        // counts from its send, before the row's expiry is written.
        let ttl = self.clamp(req.ttl);
        let name = self.name_of(&req.key);
        let secs = ttl.as_secs_f64();
        let sent = Instant::now();
        let row = self
            .bounded_acquire(session.guarded(session.client.query_one(
                &session.prepared.claim,
                &[&key, &name, &req.token, &secs, &session.token],
            )))
            .await?;
        queued.session = None;
        if !row.get::<_, bool>(0) {
            session.unreserve(key);
            return Ok(None);
        }
        Ok(Some(self.granted_plain(req, session, key, ttl, &row, sent)))
    }
}
