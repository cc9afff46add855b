//! The lifeline: how a session's end is heard the moment the server ends
//! it (an operator's `KILL`, a restart), not at the next request.
//!
//! `mysql_async` reads a connection only while a request runs, so an idle
//! session's closed socket goes unnoticed until it is next used (a renewal,
//! up to a third of the ttl later), while the server has already given its
//! locks to others. So each session takes a named lock of its own when it
//! opens, `<prefix>:#session-<connection id>` (never a key's name: a hashed
//! name has only hex digits after `#`), and once it carries a lease a
//! watcher connection waits for that lock (`GET_LOCK(name, <long>)`). The
//! server frees the lifeline with the session's other locks, in the same
//! step, so the watcher is granted it together with the next holder of any
//! of them: the watcher then marks the session dead and rings the loss
//! alarm, and the watchdog finds every lease on it `SessionExpired` without
//! a round trip. The watcher's own connection ending (a restart, a network
//! failure) closes the session too: its locks are then unknown.
//!
//! An operator sees a watcher in `SHOW PROCESSLIST` as
//! `/* dlock lifeline */ SELECT GET_LOCK(…, 3600)`.
//!
//! Cost: one more connection per session that holds something (at most
//! twice `?sessions=`, the two pools), none per lease, and no statement
//! while nothing happens.

use std::sync::Weak;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};

use super::names::hex_literal;
use super::rows::{int, rows_of};
use crate::backends::sessions::pool::PooledSession;

/// One wait of the watcher, in seconds: it asks again after that, while
/// the session lives (a bound, so a watcher of a session dropped without
/// closing ends).
const WAIT_SECS: u64 = 3_600;

/// The lifeline's name of the session with connection id `id`.
pub(super) fn name(prefix: &str, id: u32) -> String {
    format!("{prefix}:#session-{id}")
}

/// The statement a session takes its lifeline with (answers 1).
pub(super) fn take(name: &str) -> String {
    format!("SELECT GET_LOCK({}, 0)", hex_literal(name.as_bytes()))
}

/// Watches the lifeline `name` of `session` (connection id `id`) on a
/// connection of its own, opened with `opts`: returns when the session has
/// ended (then it is closed, which rings its alarm) or has been dropped.
/// Run on dlock's runtime. Generic over the session so that `session.rs`,
/// which starts the watcher, stays the only one of the two to name the other.
pub(super) async fn watch<S: PooledSession>(session: Weak<S>, id: u32, opts: Opts, name: String) {
    let ended = |why: &str| {
        if let Some(s) = session.upgrade()
            && s.is_alive()
        {
            tracing::debug!(id, why, "MySQL session's end heard by its lifeline");
            s.close();
        }
    };
    let mut conn = match Conn::new(opts).await {
        Ok(conn) => conn,
        Err(e) => {
            ended(&format!("the watcher could not connect: {e}"));
            return;
        }
    };
    // The comment names the watcher in `SHOW PROCESSLIST` (and lets a
    // query for sessions waiting on locks leave it out).
    let wait = format!(
        "/* dlock lifeline */ SELECT GET_LOCK({}, {WAIT_SECS})",
        hex_literal(name.as_bytes())
    );
    // Bounded by the session's life: each round waits an hour at most, and
    // the loop ends once the session is gone.
    loop {
        if session.upgrade().is_none_or(|s| !s.is_alive()) {
            break;
        }
        match rows_of(&mut conn, wait.clone()).await {
            Ok(answer) => {
                if answer.rows.first().and_then(|r| int(r, 0)) == Some(1) {
                    ended("its lifeline was freed");
                    break;
                }
            }
            Err(e) => {
                ended(&format!("the watcher's connection failed: {e}"));
                return;
            }
        }
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), conn.disconnect()).await;
}

/// Whether the statement's answer is the lifeline granted.
pub(super) async fn taken(conn: &mut Conn, name: &str) -> Result<bool, mysql_async::Error> {
    let answer: Option<Option<i64>> = conn.query_first(take(name)).await?;
    Ok(answer.flatten() == Some(1))
}
