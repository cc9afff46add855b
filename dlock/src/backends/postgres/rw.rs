//! Read-write locks on shared advisory locks.
//!
//! A read-write lock `key` has two advisory keys of the two-`int4` form
//! (apart from the `bigint` form of plain locks, so a plain lock and a
//! read-write lock of one key are separate locks), both from the SHA-256
//! of `<prefix>:<key>`: bytes 8..16 are the lock ([`super::rw_advisory_key_in`]),
//! bytes 16..24 the writer-intent key.
//!
//! - A reader takes the intent key shared and lets it go in the same
//!   statement (refused while a writer waits), then the lock shared; the
//!   read's fence is the key's counter read right behind it.
//! - A writer takes the intent key exclusively and keeps it while it waits
//!   for the lock, so readers that come after it stay out (writers do not
//!   starve); granted, it draws the next fence and lets the intent go.
//! - Releases announce the lock key on the release channel; waiters re-check
//!   every second as the net.
//! - Both keys are reserved on the session, so it never holds either twice.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::held::{self, Hold};
use super::session::{Reserved, Session};
use super::PostgresBackend;
use crate::backend::{lease_deadline, Lease, Renewal, RwBackend, RwMode, RwRequest};
use crate::backends::sessions;
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// A read-write attempt under way on a session: what is reserved there, and
/// what may be held and must be undone if the attempt is dropped or fails.
struct RwHold {
    session: Option<Arc<Session>>,
    main: i64,
    intent: i64,
    /// A request that may grant the lock in this mode is in flight.
    main_may_be_held: Option<Hold>,
    /// The intent key is held (or a request that may take it is in flight).
    intent_held: bool,
    /// A reader's request that takes the intent key shared is in flight.
    intent_shared: bool,
}

impl RwHold {
    fn session(&self) -> Arc<Session> {
        self.session.clone().expect("an armed hold has its session")
    }

    /// Done: the lock is held by a lease; only the intent key is forgotten.
    fn granted(mut self) -> Arc<Session> {
        let session = self.session.take().expect("an armed hold has its session");
        session.unreserve(self.intent);
        session
    }
}

impl Drop for RwHold {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let mut unlock = Vec::new();
        if let Some(hold) = self.main_may_be_held {
            unlock.push((self.main, hold));
        }
        if self.intent_held {
            unlock.push((self.intent, Hold::Intent(self.main)));
        }
        if self.intent_shared {
            unlock.push((self.intent, Hold::IntentShared));
        }
        if unlock.is_empty() {
            session.unreserve(self.main);
            session.unreserve(self.intent);
        } else {
            held::undo_in_background(session, unlock, vec![self.main, self.intent]);
        }
    }
}

fn hold_of(mode: RwMode) -> Hold {
    match mode {
        RwMode::Read => Hold::Read,
        RwMode::Write => Hold::Write,
    }
}

impl PostgresBackend {
    /// The lock and writer-intent keys of the read-write lock `key`.
    fn rw_keys(&self, key: &str) -> (i64, i64) {
        let digest = super::digest(&self.config.prefix, key);
        let at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&digest[i..i + 8]);
            i64::from_be_bytes(b)
        };
        (at(8), at(16))
    }

    /// The fence row's name of the read-write lock `key`: `rw<TAB><prefix>:<key>`
    /// (a key has no control characters, so it never names a plain lock's row).
    fn rw_name(&self, key: &str) -> String {
        format!("rw\t{}:{key}", self.config.prefix)
    }

    /// One attempt. `slot` carries a waiting writer's intent (and its
    /// session) from one attempt to the next; `keep_intent` asks a writer
    /// refused the lock to keep the intent key.
    async fn try_rw(
        &self,
        req: &RwRequest,
        slot: &mut Option<RwHold>,
        keep_intent: bool,
    ) -> Result<Option<Lease>, LockError> {
        let (main, intent) = self.rw_keys(&req.key);
        if slot
            .as_ref()
            .and_then(|h| h.session.as_ref())
            .is_some_and(|s| !s.is_alive())
        {
            // The session ended, and the intent with it: start again.
            *slot = None;
        }
        if slot.is_none() {
            let session = match self
                .sessions
                .pool
                .reserve(&[main, intent], false, || self.open_session())
                .await?
            {
                Reserved::On(session) => session,
                Reserved::Busy => return Ok(None),
            };
            *slot = Some(RwHold {
                session: Some(session),
                main,
                intent,
                main_may_be_held: None,
                intent_held: false,
                intent_shared: false,
            });
        }
        let hold = slot.as_mut().expect("set above");
        let session = hold.session();
        let ttl = self.clamp(req.ttl);
        let name = self.rw_name(&req.key);
        let sent = Instant::now();
        let fence = match req.mode {
            RwMode::Read => {
                hold.main_may_be_held = Some(Hold::Read);
                hold.intent_shared = true;
                let rw = &session.prepared.rw;
                // Pipelined: the fence is read by a statement that starts
                // after the read is granted, so it sees every write before.
                let (read_params, fence_params): (
                    [&(dyn tokio_postgres::types::ToSql + Sync); 3],
                    [&(dyn tokio_postgres::types::ToSql + Sync); 1],
                ) = ([&main, &intent, &session.token], [&name]);
                let (granted, fence) = self
                    .bounded_acquire(async {
                        tokio::try_join!(
                            session.guarded(session.client.query_one(&rw.read, &read_params)),
                            session.client.query_one(&rw.fence, &fence_params),
                        )
                    })
                    .await?;
                hold.intent_shared = false;
                if !granted.get::<_, bool>(0) {
                    hold.main_may_be_held = None;
                    *slot = None;
                    return Ok(None);
                }
                fence.get::<_, i64>(0)
            }
            RwMode::Write => {
                let had = hold.intent_held;
                hold.main_may_be_held = Some(Hold::Write);
                hold.intent_held = true;
                let row = self
                    .bounded_acquire(session.guarded(session.client.query_one(
                        &session.prepared.rw.write,
                        &[&main, &intent, &name, &had, &keep_intent, &session.token],
                    )))
                    .await?;
                let got_intent: bool = row.get(0);
                let granted: bool = row.get(1);
                if !granted {
                    hold.main_may_be_held = None;
                    hold.intent_held = got_intent && keep_intent;
                    if !hold.intent_held {
                        *slot = None;
                    }
                    return Ok(None);
                }
                hold.intent_held = false;
                row.get::<_, Option<i64>>(2).unwrap_or_default()
            }
        };
        let hold = slot.take().expect("set above");
        let mut hold = hold;
        hold.main_may_be_held = None;
        let session = hold.granted();
        let valid_until = lease_deadline(sent, ttl);
        held::remember(
            &self.held,
            &req.token,
            session,
            main,
            hold_of(req.mode),
            valid_until,
        );
        Ok(Some(Lease {
            key: req.key.clone(),
            token: req.token.clone(),
            ttl,
            fencing_token: u64::try_from(fence).ok(),
            valid_until,
            resource: format!(
                "pg_advisory_lock{}({}, {})",
                if req.mode == RwMode::Read {
                    "_shared"
                } else {
                    ""
                },
                main >> 32,
                (main << 32) >> 32
            ),
        }))
    }

    /// Renews the read-write leases `at` (indexes into `leases`) on one session.
    async fn renew_rw_on(
        &self,
        session: Arc<Session>,
        leases: &[Lease],
        at: Vec<usize>,
    ) -> Vec<(usize, Result<Renewal, LockError>)> {
        let keys: Vec<i64> = at.iter().map(|&i| self.rw_keys(&leases[i].key).0).collect();
        let sent = Instant::now();
        let rows = if session.is_alive() {
            let renew = &session.prepared.rw.renew;
            self.bounded(session.guarded(session.client.query(renew, &[&keys, &session.token])))
                .await
        } else {
            Err(self.silent())
        };
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => return self.failed_round(&session, leases, at.into_iter(), &e.to_string()),
        };
        let found: std::collections::HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
        at.into_iter()
            .zip(keys)
            .map(|(i, key)| {
                let answer = if found.contains(&key) {
                    self.renewed(&leases[i], sent)
                } else {
                    if self.forget(&leases[i]) {
                        session.unreserve(key);
                    }
                    Renewal::Refused
                };
                (i, Ok(answer))
            })
            .collect()
    }
}

#[async_trait]
impl RwBackend for PostgresBackend {
    async fn try_acquire_rw(&self, req: &RwRequest) -> Result<Option<Lease>, LockError> {
        let mut slot = None;
        self.try_rw(req, &mut slot, false).await
    }

    async fn acquire_rw(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let (main, _) = self.rw_keys(&req.key);
        // A waiting writer's intent; dropped (deadline, error, the future
        // dropped), it is let go in the background.
        let slot: Option<RwHold> = None;
        self.wait_for(
            main,
            deadline,
            &mut (self, req, slot),
            |(backend, req, slot)| Box::pin(backend.try_rw(req, slot, true)),
        )
        .await
    }

    async fn renew_rw(&self, _mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_in_rounds(
            leases,
            |i, _| i,
            |session, at| self.renew_rw_on(session, leases, at),
        )
        .await
    }

    async fn release_rw(&self, mode: RwMode, lease: &Lease) -> Result<bool, LockError> {
        let Some(h) = sessions::held::take_live(&self.held, &lease.token) else {
            return Ok(false);
        };
        let (main, intent) = (h.lock.key, self.rw_keys(&lease.key).1);
        // Dropped before the answer: unlocked in the background.
        let mut pending = RwHold {
            session: Some(h.session.clone()),
            main,
            intent,
            main_may_be_held: Some(hold_of(mode)),
            intent_held: false,
            intent_shared: false,
        };
        let (rw, client, token) = (&h.session.prepared.rw, &h.session.client, &h.session.token);
        let answer = match mode {
            RwMode::Read => {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&main, token];
                let sent = client.query_one(&rw.unlock_shared, &params);
                self.bounded(h.session.guarded(sent)).await
            }
            RwMode::Write => {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&main, &main, token];
                let sent = client.query_one(&rw.unlock, &params);
                self.bounded(h.session.guarded(sent)).await
            }
        };
        let row = match answer {
            Ok(row) => row,
            // A session that ended took its locks with it; a pooler's
            // refusal (the guard retired the session) is said as it is.
            Err(e) if !h.session.is_alive() && !matches!(e, LockError::InvalidOption { .. }) => {
                pending.main_may_be_held = None;
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        // Done: forget the key on the session (the drop unreserves).
        pending.main_may_be_held = None;
        drop(pending);
        Ok(row.get::<_, bool>(0))
    }
}
