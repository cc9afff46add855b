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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::permit_sql::PermitNames;
use super::rows::{int, rows_of};
use super::session::{Op, Session, Undo};
use super::{failed, lock, MysqlBackend};
use crate::backend::{lease_deadline, Lease, Renewal};
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// A session and its permits to renew: (index into the round, slot name).
type SessionPermits = (Arc<Session>, Vec<(usize, String)>);

impl MysqlBackend {
    pub(super) async fn renew_permit_leases(
        &self,
        leases: &[Lease],
    ) -> Vec<Result<Renewal, LockError>> {
        let mut answers: Vec<Option<Result<Renewal, LockError>>> = Vec::new();
        answers.resize_with(leases.len(), || None);
        let mut by_session: HashMap<u32, SessionPermits> = HashMap::new();
        {
            let held = lock(&self.held);
            for (i, lease) in leases.iter().enumerate() {
                match held.get(&lease.token) {
                    None => answers[i] = Some(Ok(Renewal::Refused)),
                    Some(h) if !h.session.is_alive() => {
                        answers[i] = Some(Ok(Renewal::SessionExpired))
                    }
                    Some(h) => by_session
                        .entry(h.session.id)
                        .or_insert_with(|| (h.session.clone(), Vec::new()))
                        .1
                        .push((i, h.lock.clone())),
                }
            }
        }
        let mut rounds = Vec::new();
        for (session, list) in by_session.into_values() {
            for chunk in list.chunks(super::renew::BATCH) {
                rounds.push(self.renew_permits_on(session.clone(), chunk.to_vec(), leases));
            }
        }
        for done in futures_util::future::join_all(rounds).await {
            for (i, answer) in done {
                answers[i] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Ok(Renewal::Refused)))
            .collect()
    }

    /// One statement on `session` for the permits `chunk` (index into
    /// `leases`, slot name).
    async fn renew_permits_on(
        &self,
        session: Arc<Session>,
        chunk: Vec<(usize, String)>,
        leases: &[Lease],
    ) -> Vec<(usize, Result<Renewal, LockError>)> {
        let slots: Vec<&str> = chunk.iter().map(|(_, slot)| slot.as_str()).collect();
        let mut counts: Vec<String> = chunk
            .iter()
            .map(|(i, _)| PermitNames::new(&self.config.prefix, &leases[*i].key).count)
            .collect();
        counts.sort();
        counts.dedup();
        let counts: Vec<&str> = counts.iter().map(String::as_str).collect();
        let sql =
            self.statements
                .renew_permits(&slots, &counts, self.config.session.session_timeout);
        let op: Op<Vec<Option<i64>>> = Box::new(move |conn| {
            Box::pin(async move {
                let answer = rows_of(conn, sql).await?;
                let Some(row) = answer.rows.first() else {
                    return Ok(Vec::new());
                };
                Ok((0..row.len()).map(|j| int(row, j)).collect())
            })
        });
        let sent = Instant::now();
        let answer = session
            .call(Some(self.config.session.timeout), false, op, |_| {
                Undo::default()
            })
            .await;
        match answer {
            Ok(checks) => chunk
                .into_iter()
                .enumerate()
                .map(|(j, (i, slot))| {
                    let lease = &leases[i];
                    let answer = if checks.get(j) == Some(&Some(1)) {
                        let valid_until = lease_deadline(sent, lease.ttl);
                        if let Some(h) = lock(&self.held).get_mut(&lease.token) {
                            h.valid_until = valid_until;
                        }
                        Renewal::Renewed { valid_until }
                    } else {
                        if let Some(h) = lock(&self.held).remove(&lease.token) {
                            h.session.unreserve(&slot);
                        }
                        Renewal::Refused
                    };
                    (i, Ok(answer))
                })
                .collect(),
            Err(_) if !session.is_alive() => chunk
                .into_iter()
                .map(|(i, _)| {
                    lock(&self.held).remove(&leases[i].token);
                    (i, Ok(Renewal::SessionExpired))
                })
                .collect(),
            Err(f) => chunk
                .into_iter()
                .map(|(i, _)| (i, Err(failed(&self.shown, f.clone()))))
                .collect(),
        }
    }
}
