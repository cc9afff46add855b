//! Renewal: a lease is its session's liveness. Once per round, each
//! session that carries leases is asked, in one statement per at most
//! [`BATCH`] leases, whether it still holds each name
//! (`IS_USED_LOCK(name) = CONNECTION_ID()`) and whether the row still names
//! the lease's token (a `force_release` clears it); the rows' renewal time
//! moves, for `inspect`.
//!
//! - Held and named: `Renewed`, the new local deadline counted from when
//!   the statement was sent.
//! - Held but no longer named (a forced release): `Deleted`, and the lock
//!   is let go.
//! - Not held: `Refused`.
//! - The session's connection ended (`KILL`, a restart, a network
//!   failure): `SessionExpired` for every lease on it, and only those.
//! - Any other failure: an error for each lease of that statement (the
//!   core asks again, and the lease is lost at its local deadline).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::rows::{int, rows_of};
use super::session::{Op, Session, Undo};
use super::{failed, held, lock, MysqlBackend};
use crate::backend::{lease_deadline, Lease, Renewal};
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// A session and its leases to renew: (index into the round, lock name).
type SessionLeases = (Arc<Session>, Vec<(usize, String)>);

/// The most leases one renewal statement checks (two columns each).
pub(super) const BATCH: usize = 500;

impl MysqlBackend {
    pub(super) async fn renew_leases(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let mut answers: Vec<Option<Result<Renewal, LockError>>> = Vec::new();
        answers.resize_with(leases.len(), || None);
        // Leases by session (by its id), in statements of at most BATCH.
        let mut by_session: HashMap<u32, SessionLeases> = HashMap::new();
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
            for chunk in list.chunks(BATCH) {
                rounds.push(self.renew_on(session.clone(), chunk.to_vec(), leases));
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

    /// One statement on `session` for the leases `chunk` (index into
    /// `leases`, lock name).
    async fn renew_on(
        &self,
        session: Arc<Session>,
        chunk: Vec<(usize, String)>,
        leases: &[Lease],
    ) -> Vec<(usize, Result<Renewal, LockError>)> {
        let pairs: Vec<(&str, &str)> = chunk
            .iter()
            .map(|(i, name)| (name.as_str(), leases[*i].token.as_str()))
            .collect();
        let sql = self.statements.renew(&pairs);
        let op: Op<Vec<(Option<i64>, Option<i64>)>> = Box::new(move |conn| {
            Box::pin(async move {
                let answer = rows_of(conn, sql).await?;
                let Some(row) = answer.rows.first() else {
                    return Ok(Vec::new());
                };
                Ok((0..row.len() / 2)
                    .map(|j| (int(row, 2 * j), int(row, 2 * j + 1)))
                    .collect())
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
                .map(|(j, (i, name))| {
                    let lease = &leases[i];
                    let answer = match checks.get(j) {
                        Some((Some(1), Some(1))) => {
                            let valid_until = lease_deadline(sent, lease.ttl);
                            if let Some(h) = lock(&self.held).get_mut(&lease.token) {
                                h.valid_until = valid_until;
                            }
                            Renewal::Renewed { valid_until }
                        }
                        Some((Some(1), _)) => {
                            // A forced release: the lock is let go now.
                            if let Some(h) = lock(&self.held).remove(&lease.token) {
                                held::unlock_in_background(h.session, h.lock);
                            }
                            Renewal::Deleted
                        }
                        _ => {
                            if let Some(h) = lock(&self.held).remove(&lease.token) {
                                h.session.unreserve(&name);
                            }
                            Renewal::Refused
                        }
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
