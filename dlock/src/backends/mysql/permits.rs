//! Semaphores on named locks: a permit is one of N slot locks
//! (`GET_LOCK`), the count kept in a row of `dlock_fences` and changed
//! only while no permit of the stored count is out.
//!
//! `GET_LOCK` has no shared mode, so a semaphore `name` of N permits is N
//! named locks, its *slots* (names in `permit_sql.rs`, hashed as the
//! backend's long names are: at most 61 characters, never a lock's name).
//! A permit is a slot held by a session, and lives as long as that
//! session, as a lock does: renewal asks `IS_USED_LOCK(slot) =
//! CONNECTION_ID()`, a killed client's slots are freed by the server when
//! its connection closes, a frozen one's after `?session_timeout=`.
//!
//! - **Taking** is one statement on a lock session, under the semaphore's
//!   *admin* lock (a `GET_LOCK` held for that statement only): read the
//!   stored count C from the count row; if C differs from the caller's N
//!   and a slot below C is held by another session, answer C (the caller
//!   gets [`permit_count_differs`], and takes nothing); else take the
//!   first slot below N that `IS_USED_LOCK` says is free
//!   (`GET_LOCK(slot, 0)`) and, when granted, write N as the count. So
//!   the count changes only when every permit of the old count is back,
//!   and a caller with another count is refused while any is out. Because
//!   every take and every count change runs under the admin lock, a slot
//!   found free is granted (unless SQL code outside dlock takes that very
//!   name).
//! - **Waiting** is in the server's queues: the waiters of a semaphore
//!   queue on its *door* lock (`GET_LOCK(door, seconds left)` on a waiting
//!   session), so waiters of every process are served in the server's
//!   order and only the head waiter works. The head waiter, holding the
//!   door, sends `GET_LOCK(slot k, 0.2 s)` on the same session, then the
//!   take above (the watched slot, if granted, is its permit; else any
//!   free slot); not served, it watches the next slot. A release of the
//!   watched slot wakes it in the server at once; a release of another
//!   slot is seen at the end of the 0.2 s watch (`GET_LOCK` waits on one
//!   name at a time, so with N > 1 part of the head waiter's wait is a
//!   re-check every 0.2 s; with one permit it is woken by the server
//!   only). With no idle waiting session (more waits at once than
//!   `?sessions=`), a waiter tries again every 250 ms.
//! - **Cancel safety**: a take cut short after its grant gives the slot
//!   back on its session before the session's next request (as a lock
//!   try does); a wait dropped in the door's queue or in a watch is killed
//!   (`KILL QUERY` from a lock session, `cancel.rs`), and its waiting
//!   session then lets go the door, the admin lock and every slot of the
//!   semaphore it holds, and is idle in its pool again; a head waiter
//!   dropped between statements lets them go too. No connection is opened
//!   or closed for it; only if that fails is the waiting session closed
//!   (the server then frees what it held).
//! - **Release** is `RELEASE_LOCK(slot)`; the count row stays (it counts
//!   only while one of its slots is held) and is refreshed by every grant
//!   and renewal so that the retention sweep keeps it while permits are
//!   out.
//!
//! A permit has no fencing token (the core does not show one). At most
//! [`MAX_PERMITS`] permits per semaphore.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::permit_sql::{PermitNames, Take, MAX_PERMITS};
use super::rows::{bytes, int, rows_of, undone_on_error};
use super::session::{Op, Reserved, Session, Undo};
use super::sql::Statements;
use super::{failed, held, Failure, MysqlBackend};
use crate::backend::holder::MAX_LISTED;
use crate::backend::{
    lease_deadline, permit_count_differs, Lease, PermitBackend, PermitHolder, PermitRequest,
    Renewal, SemaphoreInfo,
};
use crate::backends::sessions;
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// How long a take waits for the semaphore's admin lock (held by other
/// takes for one statement each).
pub(super) const ADMIN_WAIT: Duration = Duration::from_secs(5);

/// What a take statement answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Taken {
    /// The admin lock's `GET_LOCK` answer (1: granted).
    pub(super) admin: Option<i64>,
    /// The stored count, when it differs with a permit out.
    pub(super) other: Option<i64>,
    /// Whether a slot was taken.
    pub(super) got: bool,
    /// The slot taken.
    pub(super) slot: Option<i64>,
}

impl MysqlBackend {
    /// The names of the semaphore `req.name`, once its count is checked.
    pub(super) fn permit_names(&self, req: &PermitRequest) -> Result<PermitNames, LockError> {
        if req.permits > MAX_PERMITS {
            return Err(LockError::invalid_option(format!(
                "semaphore `{}`: {} permits, but a MySQL semaphore has at most {MAX_PERMITS}; \
                 give a smaller count",
                req.name, req.permits
            )));
        }
        Ok(PermitNames::new(&self.config.prefix, &req.name))
    }

    /// Sends a take statement on `session`; a grant whose caller left is
    /// given back there, and `forget` (a name reserved for the attempt)
    /// forgotten.
    pub(super) async fn send_take(
        &self,
        session: &Arc<Session>,
        names: &PermitNames,
        req: &PermitRequest,
        limit: Option<Duration>,
        forget: Option<&str>,
    ) -> Result<Taken, LockError> {
        let take = Take {
            watch: None,
            door: false,
        };
        let (sql, undo) = take_statements(
            &self.statements,
            self.config.session.session_timeout,
            names,
            req.permits,
            take,
        );
        let op: Op<Taken> = Box::new(move |conn| Box::pin(taken_by(conn, sql, undo)));
        session
            .call(limit, op, slot_given_back(names, forget))
            .await
            .map_err(|e| failed(&self.shown, e))
    }

    /// The permit a take answered, or why there is none; `reserved` (what
    /// the attempt reserved on `session`) is forgotten, the slot noted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn taken(
        &self,
        req: &PermitRequest,
        names: &PermitNames,
        session: Arc<Session>,
        reserved: &str,
        taken: Taken,
        ttl: Duration,
        valid_until: Instant,
    ) -> Result<Option<Lease>, LockError> {
        if taken.admin != Some(1) {
            session.unreserve(reserved);
            return Err(failed(
                &self.shown,
                Failure {
                    text: format!(
                        "semaphore `{}`: its admin lock was not granted within {ADMIN_WAIT:?}",
                        req.name
                    ),
                    transient: true,
                    broken: false,
                },
            ));
        }
        if let Some(stored) = taken.other {
            session.unreserve(reserved);
            return Err(permit_count_differs(
                &req.name,
                usize::try_from(stored).unwrap_or(usize::MAX),
                req.permits,
            ));
        }
        let slot = match (taken.got, taken.slot.and_then(|s| usize::try_from(s).ok())) {
            (true, Some(slot)) => names.slot(slot),
            _ => {
                session.unreserve(reserved);
                return Ok(None);
            }
        };
        session.reserve(&slot);
        session.unreserve(reserved);
        let resource = format!("GET_LOCK('{slot}')");
        held::remember(&self.held, &req.token, session, slot, valid_until);
        let lease = Lease::unfenced(&req.name, &req.token, ttl, valid_until, resource);
        Ok(Some(lease))
    }

    /// One attempt on a lock session.
    pub(super) async fn try_permit(
        &self,
        req: &PermitRequest,
        names: &PermitNames,
    ) -> Result<Option<Lease>, LockError> {
        // A name of this attempt's own: any live session takes it.
        let reserved = format!("{}?{}", names.base, req.token);
        let session = match self
            .sessions
            .pool
            .reserve(std::slice::from_ref(&reserved), false, || {
                self.open_session()
            })
            .await?
        {
            Reserved::On(session) => session,
            Reserved::Busy => return Ok(None),
        };
        let ttl = self.clamp(req.ttl);
        let sent = Instant::now();
        let answer = self
            .send_take(
                &session,
                names,
                req,
                Some(self.config.session.timeout + ADMIN_WAIT),
                Some(&reserved),
            )
            .await;
        match answer {
            Ok(taken) => self.taken(
                req,
                names,
                session,
                &reserved,
                taken,
                ttl,
                lease_deadline(sent, ttl),
            ),
            Err(e) => {
                session.unreserve(&reserved);
                Err(e)
            }
        }
    }
}

#[async_trait]
impl PermitBackend for MysqlBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let names = self.permit_names(req)?;
        self.try_permit(req, &names).await
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let names = self.permit_names(req)?;
        self.acquire_permit_in_turn(req, &names, deadline).await
    }

    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_permit_leases(leases).await
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(h) = sessions::held::take_live(&self.held, &lease.token) else {
            return Ok(false);
        };
        let sql = Statements::release_permit(&h.lock);
        let op: Op<Option<i64>> = Box::new(move |conn| {
            Box::pin(async move {
                let answer = rows_of(conn, sql).await?;
                Ok(answer.rows.first().and_then(|r| int(r, 0)))
            })
        });
        let limit = self.config.session.timeout;
        let answer = h.session.call_letting_go(limit, &h.lock, op).await;
        match answer {
            Ok(released) => {
                h.session.unreserve(&h.lock);
                Ok(released == Some(1))
            }
            Err(_) if !h.session.is_alive() => Ok(false),
            Err(e) => {
                held::unlock_in_background(h.session, h.lock);
                Err(failed(&self.shown, e))
            }
        }
    }

    async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        let names = self.permit_names(&PermitRequest {
            name: name.to_owned(),
            permits,
            count: 1,
            token: String::new(),
            ttl: Duration::ZERO,
        })?;
        let answer = self
            .read(self.statements.permits_available(&names, permits))
            .await?;
        let row = answer.rows.first();
        let col = |i| row.and_then(|r| int(r, i));
        let held_below = |i| usize::try_from(col(i).unwrap_or(0)).unwrap_or(0);
        let stored = col(0).and_then(|c| usize::try_from(c).ok());
        if let Some(stored) = stored.filter(|s| *s != permits && held_below(2) > 0) {
            return Err(permit_count_differs(name, stored, permits));
        }
        Ok(permits.saturating_sub(held_below(1)))
    }

    /// The connections holding slots, each shown as `connection <id>`
    /// (`KILL <id>` ends it, and every lock it holds), and the stored count.
    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let names = PermitNames::new(&self.config.prefix, name);
        let answer = self.read(self.statements.permits_inspect(&names)).await?;
        let stored = answer
            .rows
            .first()
            .and_then(|r| int(r, 0))
            .and_then(|c| usize::try_from(c).ok());
        let holders = answer
            .rows
            .iter()
            .filter_map(|r| {
                let count = usize::try_from(int(r, 2)?).ok()?;
                Some(PermitHolder::new(
                    None,
                    Some(format!("connection {}", int(r, 1)?)),
                    count,
                ))
            })
            .collect();
        Ok(SemaphoreInfo::new(stored, holders))
    }

    async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let own = format!("{}:", self.config.prefix);
        let start = format!("{own}{prefix}");
        let sql = self
            .statements
            .semaphore_keys(&self.config.prefix, &start, MAX_LISTED + 1);
        let answer = self.read(sql).await?;
        Ok(answer
            .rows
            .iter()
            .filter_map(|r| {
                let key = String::from_utf8(bytes(r, 0)?).ok()?;
                Some(key.strip_prefix(&own)?.to_owned())
            })
            .collect())
    }
}

/// The take statement of a semaphore of `permits` as `take` says (count
/// rows kept `ttl_cap`), and what lets go what it may hold if a server
/// error cuts it short.
pub(super) fn take_statements(
    statements: &Statements,
    ttl_cap: Duration,
    names: &PermitNames,
    permits: usize,
    take: Take,
) -> (String, String) {
    let sql = statements.take_permit(names, permits, ttl_cap, ADMIN_WAIT, take);
    (sql, Statements::take_permit_undo(names))
}

/// Sends `sql`, a take statement, on `conn`: what it answered. A server
/// error may cut it short holding the admin lock or a slot: `undo` lets
/// them go before the error is reported.
pub(super) async fn taken_by(
    conn: &mut mysql_async::Conn,
    sql: String,
    undo: String,
) -> Result<Taken, mysql_async::Error> {
    let answer = rows_of(conn, sql).await.map(|answer| {
        let row = answer.rows.first();
        let col = |i| row.and_then(|r| int(r, i));
        Taken {
            admin: col(0),
            other: col(1),
            got: col(2) == Some(1),
            slot: col(3),
        }
    });
    undone_on_error(conn, answer, undo).await
}

/// What undoes a take whose caller left: the slot it took given back,
/// `forget` (a name reserved for the attempt) forgotten.
pub(super) fn slot_given_back(
    names: &PermitNames,
    forget: Option<&str>,
) -> impl FnOnce(Option<&Taken>) -> Undo + Send + 'static {
    let (base, forget) = (names.base.clone(), forget.map(str::to_owned));
    move |answer| Undo {
        sql: answer
            .filter(|t| t.got)
            .and_then(|t| t.slot)
            .map(|slot| Statements::release_permit(&format!("{base}{slot}"))),
        forget,
    }
}
