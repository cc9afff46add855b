//! Bounded rows: a key idle past `?fence_retention=` (default one day)
//! leaves no row in `dlock_fences` or `dlock_holders`.
//!
//! Every fence is `GREATEST(last + 1, the server's clock in µs)`
//! (`sql::NOW_US`), so a counter row whose value is older than
//! `now - retention` belongs to a key that issued no fence for that long,
//! and may go: the key's next fence is the clock, above every fence it
//! issued before (the server's clock would have to step back by the whole
//! retention to break that). A holder row goes on the same rule (its fence
//! is that old) and only while nobody holds the key's advisory lock: the
//! row of a lease held for longer than the retention stays.
//!
//! The sweep is lazy and bounded: at most `sql::SWEEP_BATCH` rows of each table per
//! statement (the statement's text is `sql.rs`'s), sent in the background when the backend connects and then
//! behind a release, at most once a minute (`backends/sessions/sweep.rs`).

use std::sync::Arc;

use super::session::Session;
use super::Failure;
use crate::backends::sessions::pool::PooledSession;
use crate::backends::sessions::sweep::{SweepSchedule, LONGEST_PAUSE};

/// Sends the sweep on `session` in the background if it is due (at
/// connect, and then at most once a minute, or once per retention).
pub(super) fn sweep_if_due(
    schedule: &SweepSchedule,
    session: &Arc<Session>,
    statement: &str,
    shown: &str,
) {
    if !schedule.due() {
        return;
    }
    let (session, statement, shown) = (session.clone(), statement.to_owned(), shown.to_owned());
    crate::lease::background::spawn(async move {
        if !session.is_alive() {
            return;
        }
        let answer = tokio::time::timeout(
            LONGEST_PAUSE,
            session.client.query_one(statement.as_str(), &[]),
        )
        .await;
        match answer {
            Ok(Ok(row)) => {
                let (fences, holders): (i64, i64) = (row.get(0), row.get(1));
                if fences + holders > 0 {
                    tracing::debug!(fences, holders, "PostgreSQL: idle rows deleted");
                }
            }
            // The next sweep tries again; locks are not affected.
            Ok(Err(e)) => {
                let Failure { text: why, .. } = e.into();
                tracing::debug!(backend = %shown, error = %why, "PostgreSQL: the sweep of idle rows failed");
            }
            Err(_) => {
                tracing::debug!(backend = %shown, "PostgreSQL: the sweep of idle rows did not answer")
            }
        }
    });
}
