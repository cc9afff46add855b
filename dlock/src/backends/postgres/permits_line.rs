//! A semaphore's waiters in line: arrival order through the semaphore's
//! gate, a `bigint` advisory lock every take holds while it takes slots.
//!
//! A waiter whose try was refused waits for the gate in the server's own
//! queue (`turns.rs`'s wait block on an idle waiting session), so waiters
//! of every process line up in arrival order. The gate's holder then waits
//! for its `count` slots (a release's `NOTIFY` on the semaphore's base, or
//! the re-check timer for a holder whose session ended), takes them all at
//! once on its session, and lets the gate go: the server grants it to the
//! next in line inside that unlock. Meanwhile every other take, a
//! `try_acquire` included, is refused at the gate: a waiting taker of 4 is
//! not overtaken by later takers of 1, and only one taker at a time takes
//! slots (no deadlock, and no partial hold another taker could see).
//!
//! Dropped in line, the wait leaves the queue as a lock's does
//! (`turns.rs`'s `leave`); dropped while holding the gate, the slots it may
//! hold, the marker and the gate are let go behind it on its session.
//! With no idle waiting session, a waiter re-tries on a release's
//! announcement and every second (without a place in line).

use std::sync::Arc;
use std::time::Instant;

use super::held::{self, permit_reservation, Hold};
use super::permits::PermitKeys;
use super::session::{Reserved, Session};
use super::turns::Queued;
use super::{failed, sql, PostgresBackend};
use crate::backend::{permit_count_differs, Lease, PermitRequest};
use crate::LockError;

/// The gate held on `session` while its holder waits for slots: dropped
/// unsettled, what it may hold (slots, marker, gate) is let go behind it.
struct GateHeld {
    session: Option<Arc<Session>>,
    hold: Hold,
    keys: PermitKeys,
}

impl Drop for GateHeld {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            held::undo_in_background(
                session,
                vec![(self.keys.base, self.hold), (self.keys.gate, Hold::Plain)],
                vec![permit_reservation(self.keys.base)],
            );
        }
    }
}

impl PostgresBackend {
    /// `acquire_permit`: a try, then a place in line (see the module docs).
    pub(super) async fn acquire_permit_in_line(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        if let Some(lease) = self.try_permit(req).await? {
            return Ok(Some(lease));
        }
        let keys = self.permit_keys(&req.name);
        let reserved = permit_reservation(keys.base);
        if let Some(session) = self.idle_waiting_session(reserved).await {
            return self.wait_at_gate(session, keys, req, deadline).await;
        }
        self.wait_for(keys.base, deadline, &mut (self, req), |(backend, req)| {
            Box::pin(backend.try_permit(req))
        })
        .await
    }

    /// Waits in line for the gate on `session` (idle, the semaphore
    /// reserved on it), then for the slots, until `deadline`.
    async fn wait_at_gate(
        &self,
        session: Arc<Session>,
        keys: PermitKeys,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let reserved = permit_reservation(keys.base);
        let limit_ms: u128 = match deadline {
            None => 0,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    session.unreserve(reserved);
                    return Ok(None);
                }
                left.as_millis().clamp(1, i32::MAX as u128)
            }
        };
        let Some(block) = sql::wait_block(keys.gate, limit_ms, &session.token) else {
            session.unreserve(reserved);
            return Err(failed(
                &self.shown,
                "a session's claim token is not of dlock's form",
            ));
        };
        let mut queued = Queued {
            session: Some(session.clone()),
            key: keys.gate,
            reserved,
            canceller: self.sessions.pool.live(),
        };
        let statement = session.guarded(session.client.batch_execute(&block));
        let answer = match deadline {
            Some(d) => {
                let silent_at = d + self.config.session.timeout;
                match tokio::time::timeout_at(silent_at.into(), statement).await {
                    Ok(answer) => answer,
                    Err(_) => return Err(self.silent()),
                }
            }
            None => statement.await,
        };
        if let Err(e) = answer {
            return Err(failed(&self.shown, e));
        }
        // The block ended, granted or out of time: whether the gate is ours.
        let row = self
            .bounded(session.guarded(session.client.query_one(
                &session.prepared.permits.gate_held,
                &[&keys.gate, &session.token],
            )))
            .await?;
        let count = i32::try_from(req.permits).unwrap_or(i32::MAX);
        let mut gate = GateHeld {
            session: Some(session.clone()),
            hold: keys.hold(count),
            keys,
        };
        queued.session = None;
        if !row.get::<_, bool>(0) {
            gate.session = None;
            session.unreserve(reserved);
            return Ok(None);
        }
        let mut state = (self, req, &session, keys, None::<Instant>);
        let lease = self
            .wait_for(
                keys.base,
                deadline,
                &mut state,
                |(backend, req, session, keys, sent)| {
                    Box::pin(async move {
                        *sent = Some(Instant::now());
                        let Some(slot) = backend.take_on(session, req, *keys).await? else {
                            return Ok(None);
                        };
                        let at = sent.unwrap_or_else(Instant::now);
                        backend
                            .granted_permit(req, (*session).clone(), *keys, slot, at)
                            .map(Some)
                    })
                },
            )
            .await;
        match lease {
            Ok(Some(lease)) => {
                // Granted: the slots are the lease's; the gate goes to the
                // next in line.
                gate.session = None;
                held::undo_in_background(session, vec![(keys.gate, Hold::Plain)], vec![]);
                Ok(Some(lease))
            }
            // Out of time, or failed: `gate` lets everything go.
            other => other,
        }
    }

    /// How many permits of the semaphore `name` of `permits` are free: the
    /// slots nobody holds, read from `pg_locks`.
    pub(super) async fn available_permits(
        &self,
        name: &str,
        permits: usize,
    ) -> Result<usize, LockError> {
        let count = i32::try_from(permits).map_err(|_| {
            LockError::invalid_option(format!("semaphore `{name}`: too many permits"))
        })?;
        let keys = self.permit_keys(name);
        let session = match self
            .sessions
            .pool
            .reserve(&[], false, || self.open_session())
            .await?
        {
            Reserved::On(session) => session,
            Reserved::Busy => return Err(self.silent()),
        };
        let row = self
            .bounded(session.guarded(session.client.query_one(
                &session.prepared.permits.taken,
                // `$2` is an `int8` there (the marker rows' classid).
                &[&keys.base, &i64::from(keys.mark), &count],
            )))
            .await?;
        if let Some(stored) = row.get::<_, Option<i64>>(1) {
            return Err(permit_count_differs(
                name,
                usize::try_from(stored).unwrap_or(usize::MAX),
                permits,
            ));
        }
        let taken = usize::try_from(row.get::<_, i64>(0)).unwrap_or(permits);
        Ok(permits.saturating_sub(taken))
    }
}
