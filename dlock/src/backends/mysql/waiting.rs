//! Waiting in turn: an acquisition whose try was refused waits in the
//! server's own queue of the named lock (`GET_LOCK(name, timeout)`, a
//! blocking call) on a *waiting session* of its own, so that waiters of
//! every process, and SQL clients' own `GET_LOCK` on the same name, are
//! served by the server, in its order; a release wakes the next waiter
//! inside the server, and no waiter polls.
//!
//! - The first attempt is the ordinary try on a lock session, unless a try
//!   of this name was refused in the last second: the waiting statement,
//!   which a free lock grants at once, then goes first.
//! - Refused, the waiter takes a waiting session that holds nothing (a
//!   second pool of at most `?sessions=` connections, opened when first
//!   needed) and sends the blocking statement there, the deadline as
//!   `GET_LOCK`'s timeout, alone; once granted, the fence and the holder's
//!   row follow as a request of their own, one `INSERT` whose answer
//!   carries the fence (a kill may land only on the wait, `cancel.rs`). The session's lock then carries the lease, as a
//!   lock session's does; released, the session is idle again.
//! - An acquisition dropped while it waits leaves the queue with its
//!   caller, without a new connection: dlock's background runtime kills the
//!   waiting statement (`KILL QUERY`, sent on a lock session), reads its
//!   answer, lets go what it was granted meanwhile, and puts the waiting
//!   session back in its pool (`cancel.rs`; it is closed instead only if
//!   that fails).
//! - A waiter whose process dies leaves the queue when the server notices
//!   its connection closed (MariaDB checks a waiting connection about
//!   every few seconds; at the latest when its turn comes and the answer
//!   cannot be sent).
//! - With no idle waiting session (more waits at once than `?sessions=`),
//!   a waiter tries again every [`RECHECK`] (jittered).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::acquire::{give_back, recorded, Granted};
use super::cancel::QueueWait;
use super::names::hex_literal;
use super::session::{Cancel, Reserved, Session, Then};
use super::sql::{Statements, Wait};
use super::{lock, MysqlBackend};
use crate::backend::{AcquireRequest, Lease};
use crate::LockError;

/// How often a waiter without a waiting session tries again.
pub(super) const RECHECK: Duration = Duration::from_millis(250);

/// How long after a refused try a name's acquisitions wait in line at once.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// The most names [`Contended`] remembers.
const MAX_CONTENDED: usize = 1024;

/// The names whose try this backend saw refused lately, and when.
#[derive(Debug, Default)]
pub(super) struct Contended(Mutex<HashMap<String, Instant>>);

impl Contended {
    fn recently(&self, name: &str) -> bool {
        lock(&self.0)
            .get(name)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    fn mark(&self, name: &str) {
        let mut names = lock(&self.0);
        if names.len() >= MAX_CONTENDED && !names.contains_key(name) {
            names.retain(|_, at| at.elapsed() < CONTENDED_FOR);
            if names.len() >= MAX_CONTENDED {
                return;
            }
        }
        names.insert(name.to_owned(), Instant::now());
    }
}

impl MysqlBackend {
    /// `acquire`: a try, then a wait in the lock's queue (see the module
    /// docs), or tries every [`RECHECK`] when no waiting session is idle.
    pub(super) async fn acquire_in_turn(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let name = self.name_of(&req.key);
        if !self.contended.recently(&name)
            && let Some(lease) = self.try_once(req).await?
        {
            return Ok(Some(lease));
        }
        self.contended.mark(&name);
        // Before the reservation: nothing to undo if the caller leaves here.
        let cancel = self.cancel_with(Statements::unlock(&name)).await;
        match self
            .sessions
            .waiting
            .reserve(std::slice::from_ref(&name), true, || self.open_session())
            .await
        {
            Ok(Reserved::On(session)) => {
                return self
                    .wait_in_line(session, name, req, deadline, cancel)
                    .await;
            }
            Ok(Reserved::Busy) => {}
            Err(e) => {
                tracing::debug!(error = %e, "MySQL waiting session could not connect; re-trying instead");
            }
        }
        retry_until(deadline, || self.try_once(req)).await
    }

    /// Waits for `name` in the server's queue on `session` (idle, `name`
    /// reserved on it) until `deadline`; left as `cancel` says if the
    /// caller leaves.
    async fn wait_in_line(
        &self,
        session: Arc<Session>,
        name: String,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: Cancel,
    ) -> Result<Option<Lease>, LockError> {
        let (wait, limit) = match deadline {
            None => (Wait::Forever, None),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    session.unreserve(&name);
                    return Ok(None);
                }
                // The server ends the wait at the deadline; past it by the
                // request timeout, it is silent.
                (Wait::For(left), Some(left + self.config.session.timeout))
            }
        };
        let ttl = self.clamp(req.ttl);
        // The wait alone, then the fence and the holder's row as a request
        // of their own (`cancel.rs` says why).
        let queued = QueueWait::get_lock(&hex_literal(name.as_bytes()), wait);
        let record = self
            .statements
            .record_grant(&name, &self.key_of(&req.key), &req.token, ttl);
        let unlock = Statements::unlock(&name);
        let then: Then<Granted> = Box::new(move |conn, got| {
            Box::pin(async move {
                match got {
                    Some(1) => recorded(conn, record, unlock).await,
                    _ => Ok(Granted::No),
                }
            })
        });
        let answer = session
            .wait_then(
                limit,
                queued,
                cancel,
                (then, self.config.session.timeout),
                give_back(&name),
            )
            .await;
        let answer = self.named(answer, req, &name);
        // Granted somewhere between the send and now: the ttl counts from
        // the answer. What excludes others is the session's lock, which the
        // server frees only when the session ends.
        self.settle(answer, req, session, name, ttl, Instant::now())
    }
}

impl MysqlBackend {
    /// How a wait on a waiting session is left if its caller leaves: killed
    /// from a lock session (the least loaded live one; one is opened into
    /// the pool only if none lives), then `let_go` run on the waiting
    /// session.
    pub(super) async fn cancel_with(&self, let_go: String) -> Cancel {
        let killer = match self.sessions.pool.live() {
            Some(session) => Some(session),
            None => self
                .sessions
                .any(|| self.open_session(), &self.shown)
                .await
                .ok(),
        };
        Cancel { killer, let_go }
    }
}

/// A waiter without a waiting session (every one is busy, or none could
/// connect): `attempt` again after each recheck pause, until it grants or
/// `deadline` passes (`Ok(None)`).
pub(super) async fn retry_until<F, Fut>(
    deadline: Option<Instant>,
    attempt: F,
) -> Result<Option<Lease>, LockError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Option<Lease>, LockError>>,
{
    loop {
        let Some(nap) = recheck_at(deadline) else {
            return Ok(None);
        };
        tokio::time::sleep_until(nap.into()).await;
        match crate::backend::deadline::until(deadline, attempt()).await {
            None => return Ok(None),
            Some(answer) => {
                if let Some(lease) = answer? {
                    return Ok(Some(lease));
                }
            }
        }
    }
}

/// When a waiter without a waiting session tries again (jittered), at the
/// latest at `deadline`; `None` once the deadline has passed.
fn recheck_at(deadline: Option<Instant>) -> Option<Instant> {
    let mut b = [0u8; 1];
    let _ = getrandom::fill(&mut b);
    let nap = Instant::now() + RECHECK + Duration::from_millis(u64::from(b[0]) / 2);
    match deadline {
        Some(d) if Instant::now() >= d => None,
        Some(d) => Some(nap.min(d)),
        None => Some(nap),
    }
}
