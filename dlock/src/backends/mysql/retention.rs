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
//! release, at most once per [`Sweeper::every`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lock;
use super::session::{Op, Session, Undo};

/// The most rows one sweep deletes.
pub(super) const BATCH: u32 = 1_000;

/// The longest pause between two sweeps of one backend.
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

/// When a backend sweeps next.
#[derive(Debug)]
pub(super) struct Sweeper {
    /// The pause between two sweeps: the retention, at most a minute.
    pub(super) every: Duration,
    next: Mutex<Instant>,
}

impl Sweeper {
    pub(super) fn new(retention: Duration) -> Self {
        Sweeper {
            every: retention.min(LONGEST_PAUSE),
            next: Mutex::new(Instant::now()),
        }
    }

    /// Sends the sweep on `session` in the background if it is due.
    pub(super) fn maybe(&self, session: &Arc<Session>, statement: String) {
        {
            let mut next = lock(&self.next);
            let now = Instant::now();
            if now < *next {
                return;
            }
            *next = now + self.every;
        }
        let session = session.clone();
        crate::lease::background::spawn(async move {
            let op: Op<()> = Box::new(move |conn| {
                Box::pin(mysql_async::prelude::Queryable::query_drop(conn, statement))
            });
            // The next sweep tries again; locks are not affected.
            if let Err(e) = session
                .call(Some(LONGEST_PAUSE), false, op, |_| Undo::default())
                .await
            {
                tracing::debug!(error = %e.text, "MySQL: the sweep of idle rows failed");
            }
        });
    }
}
