//! One attempt: `GET_LOCK(name, 0)` and, when granted, the fence and the
//! holder's row, in one round trip on a lock session that does not hold
//! the name.

use std::sync::Arc;

use mysql_async::prelude::Queryable;
use std::time::{Duration, Instant};

use super::rows::{int, rows_of, undone_on_error};
use super::session::{Op, Reserved, Session, Undo};
use super::sql::Statements;
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
    /// Sends the try of `req` on `session` (`name` reserved there); a grant
    /// whose caller left is given back on the session.
    pub(super) async fn send_try(
        &self,
        session: &Arc<Session>,
        name: &str,
        req: &AcquireRequest,
        ttl: Duration,
        limit: Option<Duration>,
    ) -> Result<Granted, LockError> {
        let sql = self
            .statements
            .acquire(name, &self.key_of(&req.key), &req.token, ttl);
        let unlock = Statements::unlock(name);
        let op: Op<Granted> = Box::new(move |conn| Box::pin(granted_by(conn, sql, unlock)));
        let answer = session.call(limit, op, give_back(name)).await;
        self.named(answer, req, name)
    }

    /// A failed acquisition's error, naming the lock it was for.
    pub(super) fn named(
        &self,
        answer: Result<Granted, Failure>,
        req: &AcquireRequest,
        name: &str,
    ) -> Result<Granted, LockError> {
        answer.map_err(|e| {
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
            .send_try(&session, &name, req, ttl, Some(self.config.session.timeout))
            .await;
        self.settle(answer, req, session, name, ttl, sent)
    }
}

/// Sends `sql`, an acquisition statement, on `conn`: what it answered. A
/// server error may come after the grant (the fence's write refused): the
/// lock is let go (`unlock`) before the error is reported.
pub(super) async fn granted_by(
    conn: &mut mysql_async::Conn,
    sql: String,
    unlock: String,
) -> Result<Granted, mysql_async::Error> {
    let answer = rows_of(conn, sql).await.map(|answer| {
        let row = answer.rows.first();
        match row.and_then(|r| int(r, 0)) {
            Some(1) => Granted::Yes(row.and_then(|r| int(r, 1))),
            _ => Granted::No,
        }
    });
    undone_on_error(conn, answer, unlock).await
}

/// Sends `sql`, the record of a grant (`Statements::record_grant`), on
/// `conn`: the fence it answered. A server error lets the lock go
/// (`unlock`) before it is reported.
pub(super) async fn recorded(
    conn: &mut mysql_async::Conn,
    sql: String,
    unlock: String,
) -> Result<Granted, mysql_async::Error> {
    let answer = conn
        .query_drop(sql)
        .await
        .map(|()| Granted::Yes(conn.last_insert_id().and_then(|id| i64::try_from(id).ok())));
    undone_on_error(conn, answer, unlock).await
}

/// What undoes an acquisition of `name` whose caller left: a grant given
/// back, the name forgotten on the session.
pub(super) fn give_back(name: &str) -> impl FnOnce(Option<&Granted>) -> Undo + Send + 'static {
    let forget = name.to_owned();
    let unlock = Statements::unlock(name);
    move |answer| Undo {
        sql: matches!(answer, Some(Granted::Yes(_))).then_some(unlock),
        forget: Some(forget),
    }
}
