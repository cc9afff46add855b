//! Bounded rows: a lock name idle past `?fence_retention=` (default one
//! day) leaves no row in dlock's table.
//!
//! Every fence is `GREATEST(last + 1, the server's clock in µs)`
//! (`sql::NOW_US`), so a row whose fence and last renewal are older than
//! `now - retention` belongs to a name that issued no fence for that long,
//! and may go while nobody holds its lock: the name's next fence is the
//! clock, above every fence it issued before (the server's clock would
//! have to step back by the whole retention to break that).
//!
//! The sweep is lazy and bounded: at most [`BATCH`] rows per statement,
//! sent in the background when the backend connects and then behind a
//! release, at most once a minute (`backends/sessions/sweep.rs`).

use std::sync::Arc;

use super::session::{Op, Session, Undo};
use crate::backends::sessions::sweep::{SweepSchedule, LONGEST_PAUSE};

/// The most rows one sweep deletes.
pub(super) const BATCH: u32 = 1_000;

/// Sends the sweep on `session` in the background if it is due.
pub(super) fn sweep_if_due(schedule: &SweepSchedule, session: &Arc<Session>, statement: String) {
    if !schedule.due() {
        return;
    }
    let session = session.clone();
    crate::lease::background::spawn(async move {
        let op: Op<()> = Box::new(move |conn| {
            Box::pin(mysql_async::prelude::Queryable::query_drop(conn, statement))
        });
        // The next sweep tries again; locks are not affected.
        if let Err(e) = session
            .call(Some(LONGEST_PAUSE), op, |_| Undo::default())
            .await
        {
            tracing::debug!(error = %e.text, "MySQL: the sweep of idle rows failed");
        }
    });
}
