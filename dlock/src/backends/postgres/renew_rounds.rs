//! How a renewal batch of any kind (locks, read-write leases, permits) is
//! cut into statements: by the session each lease lives on, then into runs
//! bounded by count and bytes, so that no number of held leases makes one
//! statement (its arrays of keys, names and tokens) grow without bound.
//! The statements go out together; a session pipelines its own.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::held::Held;
use super::session::Session;
use super::{lock, PostgresBackend};
use crate::backend::{lease_deadline, Lease, Renewal};
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// The most leases one renewal statement names.
const MAX_STATEMENT_LEASES: usize = 1000;

/// The most bytes of key names and tokens one renewal statement carries.
const MAX_STATEMENT_BYTES: usize = 128 * 1024;

/// What naming one lease adds to a renewal statement (its key name, its
/// token and the fixed-size fields, generous).
fn statement_cost(lease: &Lease) -> usize {
    lease.key.len() + lease.token.len() + 64
}

/// The answers of one statement: each lease's renewal, by index.
pub(super) type RoundAnswers = Vec<(usize, Result<Renewal, LockError>)>;

impl PostgresBackend {
    /// The answer for `lease`, renewed by a statement sent at `sent`: its
    /// new local deadline, kept in its record too.
    pub(super) fn renewed(&self, lease: &Lease, sent: Instant) -> Renewal {
        let valid_until = lease_deadline(sent, self.clamp(lease.ttl));
        if let Some(h) = lock(&self.held).get_mut(&lease.token) {
            h.valid_until = valid_until;
        }
        Renewal::Renewed { valid_until }
    }

    /// Forgets the record of `lease`, which this backend no longer holds;
    /// false if it was gone already (released while the round was out):
    /// then its key may be asked for again on its session, and the round
    /// must neither unlock nor unreserve it there.
    pub(super) fn forget(&self, lease: &Lease) -> bool {
        lock(&self.held).remove(&lease.token).is_some()
    }

    /// The answers of a renewal statement that failed, for the leases
    /// `at` (indexes into `leases`): every one `SessionExpired` (and
    /// forgotten) when the session has ended, since its locks went with
    /// it; else the error, for each.
    pub(super) fn failed_round(
        &self,
        session: &Session,
        leases: &[Lease],
        at: impl Iterator<Item = usize>,
        error: &str,
    ) -> RoundAnswers {
        if !session.is_alive() {
            return at
                .map(|i| {
                    let _ = self.forget(&leases[i]);
                    (i, Ok(Renewal::SessionExpired))
                })
                .collect();
        }
        at.map(|i| (i, Err(super::failed(&self.shown, error.to_owned()))))
            .collect()
    }

    /// Renews `leases`: each one this backend still holds goes, as
    /// `entry(index, record)`, into a statement of its session run by
    /// `round`; a lease no longer held is `Refused`.
    pub(super) async fn renew_in_rounds<T, Fut>(
        &self,
        leases: &[Lease],
        entry: impl Fn(usize, &Held) -> T,
        round: impl Fn(Arc<Session>, Vec<T>) -> Fut,
    ) -> Vec<Result<Renewal, LockError>>
    where
        Fut: Future<Output = RoundAnswers>,
    {
        let mut answers: Vec<Option<Result<Renewal, LockError>>> =
            (0..leases.len()).map(|_| None).collect();
        // Per session: its statements so far, and the bytes of the last.
        let mut by_session: Vec<(Arc<Session>, Vec<Vec<T>>, usize)> = Vec::new();
        {
            let held = lock(&self.held);
            for (i, lease) in leases.iter().enumerate() {
                let Some(h) = held.get(&lease.token) else {
                    answers[i] = Some(Ok(Renewal::Refused));
                    continue;
                };
                let cost = statement_cost(lease);
                let at = match by_session
                    .iter()
                    .position(|(s, _, _)| Arc::ptr_eq(s, &h.session))
                {
                    Some(at) => at,
                    None => {
                        by_session.push((h.session.clone(), vec![Vec::new()], 0));
                        by_session.len() - 1
                    }
                };
                let (_, statements, bytes) = &mut by_session[at];
                let full = statements.last().is_some_and(|last| {
                    !last.is_empty()
                        && (last.len() >= MAX_STATEMENT_LEASES
                            || *bytes + cost > MAX_STATEMENT_BYTES)
                });
                if full {
                    statements.push(Vec::new());
                    *bytes = 0;
                }
                *bytes += cost;
                if let Some(last) = statements.last_mut() {
                    last.push(entry(i, h));
                }
            }
        }
        let rounds = by_session.into_iter().flat_map(|(session, statements, _)| {
            statements
                .into_iter()
                .map(move |statement| (session.clone(), statement))
        });
        let rounds: Vec<Fut> = rounds
            .map(|(session, statement)| round(session, statement))
            .collect();
        for round in futures_util::future::join_all(rounds).await {
            for (i, answer) in round {
                answers[i] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Ok(Renewal::Refused)))
            .collect()
    }
}
