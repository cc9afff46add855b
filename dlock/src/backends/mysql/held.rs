//! The leases this backend holds, by owner token: the session each lives
//! on and its lock name, and the reaper that lets go a lease whose local
//! deadline passed without a renewal (renewal off, a leaked guard): the
//! session would otherwise keep the lock for as long as it lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use super::lock;
use super::session::{Session, Undo};
use super::sql::Statements;
use crate::backends::held_deadline::ran_out;

/// One held lease.
pub(super) struct Held {
    pub(super) session: Arc<Session>,
    /// The lock name (`GET_LOCK`'s).
    pub(super) name: String,
    /// The lease's local deadline, moved by each renewal.
    pub(super) valid_until: Instant,
    /// Dropped with the entry: ends the reaper at once.
    _reaper: tokio::sync::oneshot::Sender<()>,
}

/// Held leases by owner token.
pub(super) type HeldMap = HashMap<String, Held>;

/// Records a granted lease and starts its reaper.
pub(super) fn remember(
    held: &Arc<Mutex<HeldMap>>,
    token: &str,
    session: Arc<Session>,
    name: String,
    valid_until: Instant,
) {
    let (reaper, gone) = tokio::sync::oneshot::channel();
    lock(held).insert(
        token.to_owned(),
        Held {
            session,
            name,
            valid_until,
            _reaper: reaper,
        },
    );
    crate::lease::background::spawn_daemon(reap(
        Arc::downgrade(held),
        token.to_owned(),
        valid_until,
        gone,
    ));
}

/// Lets go the lease of `token` once its local deadline has passed
/// without a renewal.
async fn reap(
    held: Weak<Mutex<HeldMap>>,
    token: String,
    at: Instant,
    gone: tokio::sync::oneshot::Receiver<()>,
) {
    let expired = ran_out(held, &token, at, gone, |h: &Held| h.valid_until).await;
    if let Some(h) = expired {
        tracing::debug!(name = %h.name, "lease ran out without renewal; releasing its lock");
        unlock_in_background(h.session, h.name);
    }
}

/// Lets go `name` on `session` and forgets it there, in the background,
/// behind whatever the session was asked before.
pub(super) fn unlock_in_background(session: Arc<Session>, name: String) {
    crate::lease::background::spawn(async move {
        let sql = Statements::unlock(&name);
        let forget = name.clone();
        let op: super::session::Op<()> = Box::new(move |conn| {
            Box::pin(async move { mysql_async::prelude::Queryable::query_drop(conn, sql).await })
        });
        let answer = session
            .call(
                Some(std::time::Duration::from_secs(10)),
                false,
                op,
                move |_| Undo {
                    sql: None,
                    forget: Some(forget),
                },
            )
            .await;
        match answer {
            Ok(()) => session.unreserve(&name),
            // Unknown: end the session, so the server frees its locks.
            Err(_) => session.close(),
        }
    });
}
