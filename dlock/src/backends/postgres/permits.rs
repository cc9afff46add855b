//! Semaphores on advisory locks: a permit is one of N slot keys, the
//! limit held by the server's lock table.
//!
//! A semaphore `name` of N permits has N slots, the `bigint` advisory keys
//! `base + 0 .. base + N - 1` (`base`: bytes 24..32 of the SHA-256 of
//! `<prefix>:<name>`, big-endian, shifted right by 21 bits so the slots
//! never overflow), and a count marker, the two-`int4` lock
//! (bytes 24..28, N) that every holder holds shared. A permit is the first
//! slot `pg_try_advisory_lock` grants, and a permit of n (`acquire_many`)
//! the first n free slots, all in one statement or none; every take goes
//! through the semaphore's gate (see `permits_line.rs`, which also keeps
//! the waiters' arrival order); the count is what the markers in
//! `pg_locks` say, so a caller with another count while a permit is out
//! is refused ([`permit_count_differs`]), and the count may change once
//! every permit is back. A session carries one permit or attempt per
//! semaphore (advisory locks are reentrant per session), so what a
//! dropped attempt may hold is found again in `pg_locks` and let go.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::held::{self, permit_reservation, Hold};
use super::session::{Reserved, Session};
use super::PostgresBackend;
use crate::backend::{
    lease_deadline, permit_count_differs, Lease, PermitBackend, PermitHolder, PermitRequest,
    Renewal, SemaphoreInfo,
};
use crate::backends::sessions;
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// An attempt under way: if dropped before its answer is read, whatever it
/// may hold of the semaphore on its session is let go in the background.
struct PermitPending {
    session: Option<Arc<Session>>,
    hold: Hold,
    base: i64,
}

impl PermitPending {
    /// The answer is read: nothing more to undo, only the reservation.
    fn settle(mut self, keep: bool) -> Arc<Session> {
        let session = self
            .session
            .take()
            .expect("an armed attempt has its session");
        if !keep {
            session.unreserve(permit_reservation(self.base));
        }
        session
    }
}

impl Drop for PermitPending {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            held::undo_in_background(
                session,
                vec![(self.base, self.hold)],
                vec![permit_reservation(self.base)],
            );
        }
    }
}

impl PostgresBackend {
    /// The keys of the semaphore `name`.
    pub(super) fn permit_keys(&self, name: &str) -> PermitKeys {
        let digest = super::digest(&self.config.prefix, name);
        let mut b = [0u8; 8];
        b.copy_from_slice(&digest[24..32]);
        let mark = i32::from_be_bytes([digest[24], digest[25], digest[26], digest[27]]);
        let mut g = [0u8; 8];
        g.copy_from_slice(&digest[16..24]);
        // In [2^62, 2^63): never a slot (within ±2^42 + 2^31 of 0).
        let gate = (i64::from_be_bytes(g) & (i64::MAX >> 1)) | (1 << 62);
        PermitKeys {
            base: i64::from_be_bytes(b) >> 21,
            mark,
            gate,
        }
    }

    /// The permit count and the count taken of `req`, as the statements
    /// take them.
    fn counts(req: &PermitRequest) -> Result<(i32, i32), LockError> {
        let count = i32::try_from(req.permits).map_err(|_| {
            LockError::invalid_option(format!("semaphore `{}`: too many permits", req.name))
        })?;
        let taking = i32::try_from(req.count)
            .ok()
            .filter(|n| (1..=count).contains(n))
            .ok_or_else(|| {
                LockError::invalid_option(format!(
                    "semaphore `{}`: cannot take {} of {} permits",
                    req.name, req.count, req.permits
                ))
            })?;
        Ok((count, taking))
    }

    /// Sends the take statement on `session` (which has the semaphore
    /// reserved): `Ok(Some(slot))`, the first of the `req.count` slots
    /// taken, or `Ok(None)`, nothing taken. Whatever an unanswered take may
    /// hold is the caller's to undo.
    pub(super) async fn take_on(
        &self,
        session: &Session,
        req: &PermitRequest,
        keys: PermitKeys,
    ) -> Result<Option<i32>, LockError> {
        let (count, taking) = Self::counts(req)?;
        let row = self
            .bounded_acquire(session.guarded(session.client.query_one(
                &session.prepared.permits.take,
                &[
                    &keys.base,
                    &keys.mark,
                    &count,
                    &session.token,
                    &taking,
                    &keys.gate,
                ],
            )))
            .await?;
        let slot: Option<i32> = row.get(0);
        let other: Option<i64> = row.get(1);
        if let Some(stored) = other {
            return Err(permit_count_differs(
                &req.name,
                usize::try_from(stored).unwrap_or(usize::MAX),
                req.permits,
            ));
        }
        Ok(slot)
    }

    /// The permit of `req` granted on `session` at `slot` (its first slot),
    /// the ttl counted from `sent`: remembered as held there, and its lease.
    pub(super) fn granted_permit(
        &self,
        req: &PermitRequest,
        session: Arc<Session>,
        keys: PermitKeys,
        slot: i32,
        sent: Instant,
    ) -> Result<Lease, LockError> {
        let (count, _) = Self::counts(req)?;
        let hold = keys.hold(count);
        let ttl = self.clamp(req.ttl);
        let key = keys.base + i64::from(slot);
        let valid_until = lease_deadline(sent, ttl);
        held::remember(&self.held, &req.token, session, key, hold, valid_until);
        let resource = if req.count == 1 {
            format!("pg_advisory_lock({key})")
        } else {
            format!("pg_advisory_lock({key}..{})", key + i64::from(count) - 1)
        };
        Ok(Lease::unfenced(
            &req.name,
            &req.token,
            ttl,
            valid_until,
            resource,
        ))
    }

    pub(super) async fn try_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let (count, _) = Self::counts(req)?;
        let keys = self.permit_keys(&req.name);
        let session = match self
            .sessions
            .pool
            .reserve(&[permit_reservation(keys.base)], false, || {
                self.open_session()
            })
            .await?
        {
            Reserved::On(session) => session,
            Reserved::Busy => return Ok(None),
        };
        let pending = PermitPending {
            session: Some(session.clone()),
            hold: keys.hold(count),
            base: keys.base,
        };
        let sent = Instant::now();
        let slot = self.take_on(&session, req, keys).await;
        let session = pending.settle(matches!(slot, Ok(Some(_))));
        let Some(slot) = slot? else {
            return Ok(None);
        };
        self.granted_permit(req, session, keys, slot, sent)
            .map(Some)
    }

    async fn renew_permits_on(
        &self,
        session: Arc<Session>,
        leases: &[Lease],
        at: Vec<(usize, i64, Hold)>,
    ) -> Vec<(usize, Result<Renewal, LockError>)> {
        let keys: Vec<i64> = at.iter().map(|(_, key, _)| *key).collect();
        let sent = Instant::now();
        let rows = if session.is_alive() {
            let renew = &session.prepared.permits.renew;
            self.bounded(session.guarded(session.client.query(renew, &[&keys, &session.token])))
                .await
        } else {
            Err(self.silent())
        };
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                let indexes = at.iter().map(|(i, _, _)| *i);
                return self.failed_round(&session, leases, indexes, &e.to_string());
            }
        };
        let found: std::collections::HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
        at.into_iter()
            .map(|(i, key, hold)| {
                let answer = if found.contains(&key) {
                    self.renewed(&leases[i], sent)
                } else {
                    // The marker may still be held: let it go (unless the
                    // permit was released meanwhile: its session may hold a
                    // new permit of the semaphore by now).
                    if self.forget(&leases[i]) {
                        held::undo_in_background(
                            session.clone(),
                            vec![(key, hold)],
                            vec![hold.reserved(key)],
                        );
                    }
                    Renewal::Refused
                };
                (i, Ok(answer))
            })
            .collect()
    }
}

/// The advisory keys of one semaphore.
#[derive(Debug, Clone, Copy)]
pub(super) struct PermitKeys {
    /// The first slot: slots are `base + 0 .. base + N - 1`.
    pub(super) base: i64,
    /// The count marker's first half (its second is N).
    pub(super) mark: i32,
    /// The gate: a taker holds it while it takes slots, and a waiter holds
    /// it while it waits in line for them.
    pub(super) gate: i64,
}

impl PermitKeys {
    /// How a permit of a semaphore of `count` permits is held.
    pub(super) fn hold(self, count: i32) -> Hold {
        Hold::Permit {
            base: self.base,
            mark: self.mark,
            count,
        }
    }
}

#[async_trait]
impl PermitBackend for PostgresBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        self.try_permit(req).await
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.acquire_permit_in_line(req, deadline).await
    }

    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_in_rounds(
            leases,
            |i, h| (i, h.lock.key, h.lock.hold),
            |session, at| self.renew_permits_on(session, leases, at),
        )
        .await
    }

    fn many_permits(&self) -> bool {
        true
    }

    async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        self.available_permits(name, permits).await
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(h) = sessions::held::take_live(&self.held, &lease.token) else {
            return Ok(false);
        };
        let Hold::Permit { base, mark, count } = h.lock.hold else {
            return Ok(false);
        };
        let pending = PermitPending {
            session: Some(h.session.clone()),
            hold: h.lock.hold,
            base,
        };
        let row = self
            .bounded(h.session.guarded(h.session.client.query_one(
                &h.session.prepared.permits.free,
                &[&base, &mark, &count, &h.session.token],
            )))
            .await;
        let row = match row {
            Ok(row) => row,
            Err(_) if !h.session.is_alive() => {
                drop(pending.settle(false));
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        drop(pending.settle(false));
        Ok(row.get::<_, i64>(0) > 0)
    }

    /// The sessions holding slots, each shown as `pid <backend pid>` (a
    /// PostgreSQL session carries no client name of dlock's), and the
    /// count the markers say.
    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let keys = self.permit_keys(name);
        let session = self.any_session().await?;
        let rows = self
            .bounded(session.client.query(
                &self.statements.permits.inspect,
                &[&keys.base, &i64::from(keys.mark)],
            ))
            .await?;
        let stored = rows
            .first()
            .and_then(|r| usize::try_from(r.get::<_, i64>(0)).ok());
        let holders = rows
            .iter()
            .map(|r| {
                let pid: i32 = r.get(1);
                let count = usize::try_from(r.get::<_, i64>(2)).unwrap_or(0);
                PermitHolder::new(None, Some(format!("pid {pid}")), count)
            })
            .collect();
        Ok(SemaphoreInfo::new(stored, holders))
    }

    /// A semaphore is keyed by a hash of its name: the names cannot be read back.
    async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let _ = prefix;
        Err(LockError::invalid_option(
            "PostgreSQL keys a semaphore by a hash of its name, so its semaphores cannot be listed; inspect one by name (dlock::Semaphore::inspect)".to_owned(),
        ))
    }
}
