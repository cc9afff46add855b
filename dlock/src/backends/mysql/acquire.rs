//! One attempt: `GET_LOCK(name, 0)` and, when granted, the fence and the
//! holder's row, in one round trip on a lock session that does not hold
//! the name.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rows::{int, rows_of};
use super::session::{Cancel, Op, Reserved, Session, Undo};
use super::sql::{Statements, Wait};
use super::{failed, held, Failure, MysqlBackend};
use crate::backend::{lease_deadline, AcquireRequest, Lease};
use crate::backends::sessions;
use crate::LockError;

/// What an acquisition statement answered.
#[derive(Debug, Clone, Copy)]
pub(super) enum Granted {
    /// Granted, with this fence.
    Yes(Option<i64>),
    /// `GET_LOCK` answered 0: held by another session (or its wait timed out).
    No,
}

impl MysqlBackend {
    /// Sends the acquisition statement of `req` on `session` (`name`
    /// reserved there), waiting as `wait` says (a wait in the server's
    /// queue is left as `cancel` says if its caller leaves); a grant whose
    /// caller left is given back on the session. A server error after the
    /// grant (the fence's write refused) lets the lock go before it is
    /// reported.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn send_acquire(
        &self,
        session: &Arc<Session>,
        name: &str,
        req: &AcquireRequest,
        ttl: Duration,
        wait: Wait,
        limit: Option<Duration>,
        cancel: Option<Cancel>,
    ) -> Result<Granted, LockError> {
        let sql = self
            .statements
            .acquire(name, &self.key_of(&req.key), &req.token, ttl, wait);
        let unlock = Statements::unlock(name);
        let op: Op<Granted> = Box::new(move |conn| {
            Box::pin(async move {
                match rows_of(conn, sql).await {
                    Ok(answer) => {
                        let row = answer.rows.first();
                        match row.and_then(|r| int(r, 0)) {
                            Some(1) => Ok(Granted::Yes(row.and_then(|r| int(r, 1)))),
                            _ => Ok(Granted::No),
                        }
                    }
                    Err(e) => {
                        // The lock may have been granted before the
                        // failure: let it go (harmless if not held).
                        if matches!(e, mysql_async::Error::Server(_)) {
                            let _ = mysql_async::prelude::Queryable::query_drop(conn, unlock).await;
                        }
                        Err(e)
                    }
                }
            })
        });
        let forget = name.to_owned();
        let unlock = Statements::unlock(name);
        session
            .call(limit, cancel, op, move |answer| Undo {
                sql: matches!(answer, Some(Granted::Yes(_))).then_some(unlock),
                forget: Some(forget),
            })
            .await
            .map_err(|e| {
                // A refused grant names the lock it was for.
                let text = format!("acquiring `{}` (lock name `{name}`): {}", req.key, e.text);
                failed(&self.shown, Failure { text, ..e })
            })
    }

    /// What an answer to `GET_LOCK` on `session` comes to: a grant,
    /// remembered as held there, its ttl counted from `counted_from`; or
    /// the name let go on the session.
    pub(super) fn settle(
        &self,
        answer: Result<Granted, LockError>,
        req: &AcquireRequest,
        session: Arc<Session>,
        name: String,
        ttl: Duration,
        counted_from: Instant,
    ) -> Result<Option<Lease>, LockError> {
        match answer {
            Ok(Granted::Yes(fence)) => {
                let valid_until = lease_deadline(counted_from, ttl);
                let resource = format!("GET_LOCK('{name}')");
                held::remember(&self.held, &req.token, session, name, valid_until);
                Ok(Some(sessions::lease(
                    req,
                    ttl,
                    fence,
                    valid_until,
                    resource,
                )))
            }
            Ok(Granted::No) => {
                session.unreserve(&name);
                Ok(None)
            }
            Err(e) => {
                session.unreserve(&name);
                Err(e)
            }
        }
    }

    /// One attempt on a lock session without the name.
    pub(super) async fn try_once(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let name = self.name_of(&req.key);
        let session = match self
            .sessions
            .pool
            .reserve(std::slice::from_ref(&name), false, || self.open_session())
            .await?
        {
            Reserved::On(session) => session,
            Reserved::Busy => return Ok(None),
        };
        let ttl = self.clamp(req.ttl);
        let sent = Instant::now();
        let answer = self
            .send_acquire(
                &session,
                &name,
                req,
                ttl,
                Wait::No,
                Some(self.config.session.timeout),
                None,
            )
            .await;
        self.settle(answer, req, session, name, ttl, sent)
    }
}
