//! Renewal of permits: as for locks (`renew.rs`), a permit is its
//! session's liveness. Once per round, each session that carries permits
//! is asked, in one statement per at most [`BATCH`](super::renew::BATCH)
//! permits, whether it still holds each slot
//! (`IS_USED_LOCK(slot) = CONNECTION_ID()`), and the semaphores' count
//! rows are kept (see `permits.rs`).
//!
//! - Held: `Renewed`, the new local deadline counted from when the
//!   statement was sent.
//! - Not held: `Refused`.
//! - The session's connection ended: `SessionExpired` for every permit on
//!   it, and only those.
//! - Any other failure: an error for each permit of that statement.

use super::permit_sql::PermitNames;
use super::renew::Found;
use super::rows::{int, rows_of};
use super::session::Op;
use super::MysqlBackend;
use crate::backend::{Lease, Renewal};
use crate::LockError;

impl MysqlBackend {
    pub(super) async fn renew_permit_leases(
        &self,
        leases: &[Lease],
    ) -> Vec<Result<Renewal, LockError>> {
        let checks = |chunk: &[(usize, String)]| self.permit_checks(chunk, leases);
        self.renew_by_session(leases, checks).await
    }

    /// The statement that renews the permits of `chunk` (index into
    /// `leases`, slot name): whether the session holds each slot; it keeps
    /// the semaphores' count rows too.
    fn permit_checks(&self, chunk: &[(usize, String)], leases: &[Lease]) -> Op<Vec<Found>> {
        let slots: Vec<&str> = chunk.iter().map(|(_, slot)| slot.as_str()).collect();
        let mut counts: Vec<String> = chunk
            .iter()
            .map(|(i, _)| PermitNames::new(&self.config.prefix, &leases[*i].key).count)
            .collect();
        counts.sort();
        counts.dedup();
        let counts: Vec<&str> = counts.iter().map(String::as_str).collect();
        let timeout = self.config.session.session_timeout;
        let sql = self.statements.renew_permits(&slots, &counts, timeout);
        Box::new(move |conn| {
            Box::pin(async move {
                let answer = rows_of(conn, sql).await?;
                let Some(row) = answer.rows.first() else {
                    return Ok(Vec::new());
                };
                let found = (0..row.len()).map(|j| match int(row, j) {
                    Some(1) => Found::Held,
                    _ => Found::NotHeld,
                });
                Ok(found.collect())
            })
        })
    }
}
