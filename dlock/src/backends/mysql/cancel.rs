//! A wait whose caller left (the acquisition's future dropped while its
//! `GET_LOCK` waits in the server's queue): how the waiting session leaves
//! the queue and goes back to its pool, without a new connection.
//!
//! Closing the session would do it too, but each cancelled wait then costs
//! a connection (and its lifeline watcher's), and the server logs every
//! such close as an aborted connection: an operator's soak with one wait
//! in ten cancelled opened 13,211 connections in an hour. Instead, on
//! dlock's background runtime (the caller's future is gone):
//!
//! 1. `KILL QUERY <the waiting connection's id>` from a session of the
//!    other pool (a lock session, whose statements are short; never a
//!    lifeline watcher, whose own `GET_LOCK` is not a waiter). Repeated
//!    while the statement has not answered, at most [`KILLS`] times: a
//!    statement still on the wire when the first kill lands is caught by
//!    the next.
//! 2. The waiting statement's answer is read off the connection: a killed
//!    `GET_LOCK` answers NULL (or fails with error 1317, "Query execution
//!    was interrupted"); one granted just before the kill answers 1.
//! 3. [`let_go`] runs what releases whatever the statement may have taken
//!    (`RELEASE_LOCK` of its names: a grant in the race is given back, and
//!    the next waiter served). The waiting session held nothing else
//!    (it is taken only when idle), so nothing of another lease is touched.
//! 4. The session's names are forgotten: it is idle in its pool again.
//!
//! If any step fails (no lock session, the kill refused, no answer after
//! the kills, a broken connection), the waiting session is closed as
//! before: the server then takes it out of the queue and frees its locks.
//!
//! What a kill may land on is one statement alone in its request, a
//! [`QueueWait`]; what follows a grant (the fence, a permit's take) is a
//! request of its own, sent only while the caller is there, and never
//! killed. A kill that lands between two statements of one request
//! (MariaDB 10.11: after the first has ended, before the next begins)
//! ends the request without the rest of its answer: the client waits for
//! a result that never comes, while the session keeps what the first
//! statement took. Seen when the acquisition's `GET_LOCK` and fence were
//! one request: a wait dropped as its turn came left the lock held three
//! seconds, until the kills ran out and the session was closed
//! (`a_wait_dropped_as_its_turn_comes_is_given_back_at_once`). A request
//! of one statement is answered wherever the kill lands, and a kill that
//! finds the connection idle is forgotten when its next request begins.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::sql::Wait;

/// How many `KILL QUERY` a cancelled wait sends at most.
pub(super) const KILLS: u32 = 3;

/// How long a killed statement is given to answer before the next kill.
pub(super) const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// How long one `KILL QUERY`, or one letting go, may take.
pub(super) const LIMIT: Duration = Duration::from_secs(5);

/// MySQL's and MariaDB's "Query execution was interrupted".
const INTERRUPTED: u16 = 1317;

/// The statement that ends the statement running on connection `id`
/// (the connection stays).
pub(super) fn kill_query(id: u32) -> String {
    format!("KILL QUERY {id}")
}

/// Whether `e` is a statement cut short by `KILL QUERY`.
pub(super) fn interrupted(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if s.code == INTERRUPTED)
}

/// A wait in a server queue that a cancel may kill: `GET_LOCK` of one
/// name, alone in its request (see the module docs). Answers 1 (granted),
/// 0 (the wait ran out) or NULL (cut short by a kill).
#[derive(Debug)]
pub(super) struct QueueWait(String);

impl QueueWait {
    /// `SELECT GET_LOCK(<name>, <wait>)`; `name` is an SQL expression
    /// (a literal, or `CONCAT` of literals).
    pub(super) fn get_lock(name: &str, wait: Wait) -> Self {
        QueueWait(format!("SELECT GET_LOCK({name}, {})", wait.seconds()))
    }

    /// Sends the statement on `conn`: its one column, `None` for NULL.
    pub(super) async fn answer(self, conn: &mut Conn) -> Result<Option<i64>, mysql_async::Error> {
        let got: Option<Option<i64>> = conn.query_first(self.0).await?;
        Ok(got.flatten())
    }
}

/// Runs `sql` (statements that let names go, harmless where nothing is
/// held) on the connection of a killed wait: once more if a kill cut it
/// short after all. Answers whether it ran.
pub(super) async fn let_go(conn: &mut Conn, sql: &str) -> bool {
    for _ in 0..2 {
        match tokio::time::timeout(LIMIT, conn.query_drop(sql)).await {
            Ok(Ok(())) => return true,
            Ok(Err(e)) if interrupted(&e) => continue,
            _ => return false,
        }
    }
    false
}
