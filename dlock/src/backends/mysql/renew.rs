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
use super::{failed, held, lock, Failure, MysqlBackend};
use crate::backend::{lease_deadline, Lease, Renewal};
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// A session and its leases to renew: (index into the round, lock name).
type SessionLeases = (Arc<Session>, Vec<(usize, String)>);

/// The most leases one renewal statement checks (two columns each).
pub(super) const BATCH: usize = 500;

impl MysqlBackend {
    pub(super) async fn renew_leases(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let checks = |chunk: &[(usize, String)]| self.lock_checks(chunk, leases);
        self.renew_by_session(leases, checks).await
    }

    /// Renews `leases` (locks' or permits') session by session: a lease
    /// this backend does not hold is `Refused`, one on a dead session
    /// `SessionExpired`; for the others, one statement per at most
    /// [`BATCH`] on each session, all sessions at once: `checks` makes it
    /// for a chunk (index into `leases`, the server's lock name).
    pub(super) async fn renew_by_session(
        &self,
        leases: &[Lease],
        checks: impl Fn(&[(usize, String)]) -> Op<Vec<Found>>,
    ) -> Vec<Result<Renewal, LockError>> {
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
                let op = checks(chunk);
                rounds.push(self.renew_on(session.clone(), chunk.to_vec(), leases, op));
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

    /// The statement that renews the locks of `chunk` (index into `leases`,
    /// lock name): whether the session holds each and its row names the
    /// lease's token.
    fn lock_checks(&self, chunk: &[(usize, String)], leases: &[Lease]) -> Op<Vec<Found>> {
        let pairs: Vec<(&str, &str)> = chunk
            .iter()
            .map(|(i, name)| (name.as_str(), leases[*i].token.as_str()))
            .collect();
        let sql = self.statements.renew(&pairs);
        Box::new(move |conn| {
            Box::pin(async move {
                let answer = rows_of(conn, sql).await?;
                let Some(row) = answer.rows.first() else {
                    return Ok(Vec::new());
                };
                let found =
                    (0..row.len() / 2).map(|j| match (int(row, 2 * j), int(row, 2 * j + 1)) {
                        (Some(1), Some(1)) => Found::Held,
                        (Some(1), _) => Found::ForcedOff,
                        _ => Found::NotHeld,
                    });
                Ok(found.collect())
            })
        })
    }

    /// Sends `op`, one renewal statement, on `session` for `chunk`, and
    /// answers each lease by what it found.
    async fn renew_on(
        &self,
        session: Arc<Session>,
        chunk: Vec<(usize, String)>,
        leases: &[Lease],
        op: Op<Vec<Found>>,
    ) -> Vec<(usize, Result<Renewal, LockError>)> {
        let sent = Instant::now();
        let limit = Some(self.config.session.timeout);
        let answer = session.call(limit, op, |_| Undo::default()).await;
        self.renewed(&session, chunk, leases, sent, answer)
    }

    /// The answers of one renewal statement on `session`, sent at `sent`,
    /// for `chunk` (index into `leases`, the server's lock name): what it
    /// found of each lease, in order, or its failure. A lease held is
    /// renewed from `sent`; one forced off is let go; one not held is
    /// forgotten; on a session that ended, every lease is expired.
    pub(super) fn renewed(
        &self,
        session: &Session,
        chunk: Vec<(usize, String)>,
        leases: &[Lease],
        sent: Instant,
        found: Result<Vec<Found>, Failure>,
    ) -> Vec<(usize, Result<Renewal, LockError>)> {
        match found {
            Ok(found) => chunk
                .into_iter()
                .zip(
                    found
                        .into_iter()
                        .chain(std::iter::repeat_with(|| Found::NotHeld)),
                )
                .map(|((i, name), found)| {
                    let lease = &leases[i];
                    let answer = match found {
                        Found::Held => {
                            let valid_until = lease_deadline(sent, lease.ttl);
                            if let Some(h) = lock(&self.held).get_mut(&lease.token) {
                                h.valid_until = valid_until;
                            }
                            Renewal::Renewed { valid_until }
                        }
                        Found::ForcedOff => {
                            // A forced release: the lock is let go now.
                            if let Some(h) = lock(&self.held).remove(&lease.token) {
                                held::unlock_in_background(h.session, h.lock);
                            }
                            Renewal::Deleted
                        }
                        Found::NotHeld => {
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

/// What a renewal statement found of one lease.
pub(super) enum Found {
    /// Its session holds the lock, and the row names the lease.
    Held,
    /// Its session holds the lock, but the row no longer names the lease
    /// (a forced release).
    ForcedOff,
    /// Its session does not hold the lock.
    NotHeld,
}
