//! The leases this backend holds, by owner token: the session each lives
//! on and its lock name, and the reaper that lets go a lease whose local
//! deadline passed without a renewal (renewal off, a leaked guard): the
//! session would otherwise keep the lock for as long as it lives.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::session::{Session, Undo};
use super::sql::Statements;
use crate::backends::sessions;
use crate::backends::sessions::pool::PooledSession;

/// Held leases by owner token.
pub(super) type HeldMap = sessions::held::HeldMap<Session, String>;

/// Records a granted lease and starts its reaper, which lets the lock go
/// when the lease's local deadline passes without a renewal.
pub(super) fn remember(
    held: &Arc<Mutex<HeldMap>>,
    token: &str,
    session: Arc<Session>,
    name: String,
    valid_until: Instant,
) {
    // Its end is heard at once from now on (`lifeline.rs`).
    session.watch();
    sessions::held::remember(held, token, session, name, valid_until, |h| {
        tracing::debug!(name = %h.lock, "lease ran out without renewal; releasing its lock");
        unlock_in_background(h.session, h.lock);
    });
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
            .call(Some(std::time::Duration::from_secs(10)), op, move |_| {
                Undo {
                    sql: None,
                    forget: Some(forget),
                }
            })
            .await;
        match answer {
            Ok(()) => session.unreserve(&name),
            // Unknown: end the session, so the server frees its locks.
            Err(_) => session.close(),
        }
    });
}
