//! Renewing plain locks at a cost per lock that does not grow with the
//! number held. `pg_locks` is built from the whole server's lock table at
//! every read, so checking each renewal statement's locks against it (as
//! a correlated `EXISTS` once did) made a round cost (statements × all the
//! server's locks): 16× the time for 10× the locks. Here each session
//! reads its own advisory locks once per round (`own_locks`, filtered by
//! its pid), and the round's statements only move the holder rows'
//! expiry; the two go out together on the session.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::OnceCell;

use super::lock_table::is_full;
use super::renew_rounds::RoundAnswers;
use super::session::Session;
use super::{advisory_key_in, held, lock, PostgresBackend};
use crate::backend::{Lease, Renewal};
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// The advisory locks each session of a round holds, by the session's
/// pid: read by the first of its statements, shared by the others. `Err`
/// holds the failed read's text.
#[derive(Default)]
struct OwnLocks(Mutex<HashMap<i32, Arc<OnceCell<OwnRead>>>>);

type OwnRead = Result<Arc<HashSet<i64>>, String>;

impl PostgresBackend {
    /// Renews plain-lock `leases` (see the module docs).
    pub(super) async fn renew_plain(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let own = OwnLocks::default();
        self.renew_in_rounds(
            leases,
            |i, _| i,
            |session, at| self.renew_plain_on(session, leases, at, &own),
        )
        .await
    }

    /// The advisory locks `session` holds, read once per round.
    async fn own_locks(&self, session: &Session, own: &OwnLocks) -> OwnRead {
        let cell = lock(&own.0).entry(session.pid).or_default().clone();
        cell.get_or_init(|| async {
            let own_locks = &session.prepared.own_locks;
            self.bounded(session.guarded(session.client.query(own_locks, &[&session.token])))
                .await
                .map(|rows| Arc::new(rows.iter().map(|row| row.get::<_, i64>(0)).collect()))
                .map_err(|e| e.to_string())
        })
        .await
        .clone()
    }

    /// Renews the leases `at` (indexes into `leases`) on one session.
    async fn renew_plain_on(
        &self,
        session: Arc<Session>,
        leases: &[Lease],
        at: Vec<usize>,
        own: &OwnLocks,
    ) -> RoundAnswers {
        if !session.is_alive() {
            at.iter().for_each(|&i| {
                let _ = self.forget(&leases[i]);
            });
            return at
                .into_iter()
                .map(|i| (i, Ok(Renewal::SessionExpired)))
                .collect();
        }
        let names: Vec<String> = at.iter().map(|&i| self.name_of(&leases[i].key)).collect();
        let tokens: Vec<&str> = at.iter().map(|&i| leases[i].token.as_str()).collect();
        let secs: Vec<f64> = at
            .iter()
            .map(|&i| self.clamp(leases[i].ttl).as_secs_f64())
            .collect();
        let sent = Instant::now();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&names, &tokens, &secs];
        let (owned, rows) = tokio::join!(
            self.own_locks(&session, own),
            tokio::time::timeout(
                self.config.session.timeout,
                session.client.query(&session.prepared.renew, &params)
            ),
        );
        let owned = match owned {
            Ok(owned) => owned,
            Err(e) => return self.failed_round(&session, leases, at.into_iter(), &e),
        };
        let rows = match rows {
            Ok(Ok(rows)) => Some(rows),
            // A full lock table refused the rows' write: the session's
            // locks answer alone (see `lock_table.rs`).
            Ok(Err(e)) if is_full(&e) => None,
            Ok(Err(e)) => {
                let e = super::failed(&self.shown, e).to_string();
                return self.failed_round(&session, leases, at.into_iter(), &e);
            }
            Err(_) => {
                let e = self.silent().to_string();
                return self.failed_round(&session, leases, at.into_iter(), &e);
            }
        };
        let ours: Option<HashSet<&str>> = rows
            .as_ref()
            .map(|rows| rows.iter().map(|row| row.get::<_, &str>(0)).collect());
        at.into_iter()
            .zip(&names)
            .map(|(i, name)| {
                let key = advisory_key_in(&self.config.prefix, &leases[i].key);
                let answer = if !owned.contains(&key) {
                    if self.forget(&leases[i]) {
                        session.unreserve(key);
                    }
                    Renewal::Refused
                } else if ours
                    .as_ref()
                    .is_none_or(|ours| ours.contains(name.as_str()))
                {
                    self.renewed(&leases[i], sent)
                } else {
                    // The row names another holder: force-released. The
                    // session still has the lock: let it go.
                    if self.forget(&leases[i]) {
                        held::unlock_in_background(session.clone(), key);
                    }
                    Renewal::Deleted
                };
                (i, Ok(answer))
            })
            .collect()
    }
}
