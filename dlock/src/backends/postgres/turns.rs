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
//!   blocking statement there. The session's lock then carries the lease,
//!   as a lock session's does; released, the session is idle again.
//! - The deadline is the statement's `lock_timeout` (set for that
//!   statement only): the server takes the waiter out of the queue when it
//!   passes. An acquisition dropped while it waits closes its waiting
//!   session (which holds nothing else), so the server drops it from the
//!   queue.
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

use super::held;
use super::session::{Reserved, Session};
use super::{advisory_key_in, failed, lock, PostgresBackend};
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

/// A wait in the lock's queue: if dropped before its answer is read, its
/// waiting session is closed, which takes it out of the queue (and frees
/// the lock if it was granted meanwhile).
struct Queued {
    session: Option<Arc<Session>>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            session.close();
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
        // Whether the server answered this acquisition: the wait's end
        // before any answer is an outage, not contention (issue 68).
        let mut heard = false;
        // Out without an answer from here (`lease/outcome.rs`): a waiting
        // session that cannot be opened is silence too.
        crate::backend::hearing::sending();
        if !self.contended.recently(key) {
            // Bounded by the wait, not by the request timeout alone: a
            // short wait on a stopped server ends at its deadline.
            let sent = Instant::now();
            match crate::backend::deadline::until(deadline, self.try_once(req)).await {
                Some(answer) => {
                    let answer = answer?;
                    crate::backend::hearing::answered();
                    if let Some(lease) = answer {
                        return Ok(Some(lease));
                    }
                    heard = true;
                }
                None => {
                    return Err(crate::backend::transient::unanswered(
                        self.shown.clone(),
                        sent,
                    ))
                }
            }
        }
        self.contended.mark(key);
        match self
            .sessions
            .waiting
            .reserve(&[key], false, || self.open_session())
            .await
        {
            Ok(Reserved::On(session)) if session.load() == 1 => {
                return self.wait_in_line(session, key, req, deadline).await;
            }
            Ok(Reserved::On(session)) => session.unreserve(key),
            Ok(Reserved::Busy) => {}
            Err(e) => {
                tracing::debug!(error = %e, "PostgreSQL waiting session could not connect; re-checking instead");
            }
        }
        self.wait_for(key, deadline, heard, &mut (self, req), |(backend, req)| {
            Box::pin(backend.try_once(req))
        })
        .await
    }

    /// Waits for `key` in the server's queue on `session` (idle, `key`
    /// reserved on it) until `deadline`.
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
        let mut queued = Queued {
            session: Some(session.clone()),
        };
        let ttl = self.clamp(req.ttl);
        let name = self.name_of(&req.key);
        let secs = ttl.as_secs_f64();
        let limit = limit_ms.to_string();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [&key, &name, &req.token, &secs, &limit, &session.token];
        let statement = session.guarded(session.client.query_one(&session.prepared.wait, &params));
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
        // A refused statement may have been granted the lock before its
        // failure (advisory locks are not transactional): unlocked behind
        // it, on the session, before the key is free for this session.
        let row = match answer {
            Ok(row) => row,
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                queued.session = None;
                held::unlock_in_background(session, key);
                return Ok(None);
            }
            Err(e) if e.code() == Some(&SqlState::OUT_OF_MEMORY) => {
                queued.session = None;
                held::unlock_in_background(session, key);
                return Err(self.lock_table_full());
            }
            // Unknown: the drop of `queued` closes the session.
            Err(e) => return Err(failed(&self.shown, e)),
        };
        queued.session = None;
        // Granted somewhere between the send and now: the ttl counts from
        // the answer. What excludes others is the session's lock, which
        // the server frees only when the session ends.
        let answered = Instant::now();
        Ok(Some(
            self.granted_plain(req, session, key, ttl, &row, answered),
        ))
    }
}
