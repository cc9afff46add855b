//! Waiting for a permit: in the door's queue, then as the head waiter
//! watching one slot at a time (the design is in `permits.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cancel;
use super::permit_sql::{PermitNames, Take};
use super::permits::{slot_given_back, take_statements, taken_by, Taken};
use super::session::{Cancel, Op, Reserved, Session, Then, Undo};
use super::sql::{Statements, Wait};
use super::waiting::retry_until;
use super::{failed, MysqlBackend};
use crate::backend::{lease_deadline, Lease, PermitRequest};
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// How long the head waiter watches one slot before it looks at every
/// slot again and turns to the next.
pub(super) const WATCH: Duration = Duration::from_millis(200);

/// A waiting session that may hold the door: dropped armed, it lets go
/// the door, a watched slot and the admin lock on dlock's runtime, then
/// forgets the door (so that no other wait takes the session before), or
/// is closed if that fails: an acquisition dropped between two statements,
/// or in one, leaves nothing.
struct DoorSession {
    session: Option<Arc<Session>>,
    /// What lets go all the wait may hold (`Statements::permit_let_go`).
    let_go: String,
    door: String,
}

impl DoorSession {
    fn get(&self) -> &Arc<Session> {
        self.session.as_ref().expect("an armed door session")
    }

    /// The session carries a permit now, or holds nothing: keep it open.
    fn keep(mut self) -> Arc<Session> {
        self.session.take().expect("an armed door session")
    }
}

impl Drop for DoorSession {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let (let_go, door) = (
            std::mem::take(&mut self.let_go),
            std::mem::take(&mut self.door),
        );
        // Behind the request in flight, if any (killed, see `cancel.rs`).
        crate::lease::background::spawn(async move {
            let op: Op<bool> = Box::new(move |conn| {
                Box::pin(async move { Ok(cancel::let_go(conn, &let_go).await) })
            });
            let done = session.call(Some(2 * cancel::LIMIT), op, |_| Undo::default());
            if matches!(done.await, Ok(true)) {
                session.unreserve(&door);
            } else {
                session.close();
            }
        });
    }
}

impl MysqlBackend {
    /// `acquire_permit`: a try, then the door's queue and the head
    /// waiter's watches on a waiting session, or a try every 250 ms when
    /// no waiting session is idle.
    pub(super) async fn acquire_permit_in_turn(
        &self,
        req: &PermitRequest,
        names: &PermitNames,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        if let Some(lease) = self.try_permit(req, names).await? {
            return Ok(Some(lease));
        }
        match self
            .sessions
            .waiting
            .reserve(std::slice::from_ref(&names.door), true, || {
                self.open_session()
            })
            .await
        {
            Ok(Reserved::On(session)) => {
                return self.wait_at_door(session, req, names, deadline).await
            }
            Ok(Reserved::Busy) => {}
            Err(e) => {
                tracing::debug!(error = %e, "MySQL waiting session could not connect; re-trying instead");
            }
        }
        retry_until(deadline, || self.try_permit(req, names)).await
    }

    /// Queues for the door on `session` (idle, the door's name reserved on
    /// it), then, as head waiter, watches the slots until served or
    /// `deadline`.
    async fn wait_at_door(
        &self,
        session: Arc<Session>,
        req: &PermitRequest,
        names: &PermitNames,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let let_go = Statements::permit_let_go(names, req.permits);
        let door = DoorSession {
            session: Some(session),
            let_go: let_go.clone(),
            door: names.door.clone(),
        };
        let Some((wait, limit)) = self.wait_left(deadline, None) else {
            door.keep().unreserve(&names.door);
            return Ok(None);
        };
        let queue = Statements::permit_door(names, wait);
        let then: Then<Option<i64>> = Box::new(|_, got| Box::pin(async move { Ok(got) }));
        let cancel = self.cancel_with(let_go.clone()).await;
        let queued = door
            .get()
            .wait_then(
                limit,
                queue,
                cancel,
                (then, self.config.session.timeout),
                |_| Undo::default(),
            )
            .await
            .map_err(|e| failed(&self.shown, e))?;
        if queued != Some(1) {
            // The deadline passed in the queue: the door was not granted.
            door.keep().unreserve(&names.door);
            return Ok(None);
        }
        let mut k = first_watch(req.permits);
        loop {
            let Some((wait, limit)) = self.wait_left(deadline, Some(WATCH)) else {
                // Dropped: the door is let go, the session kept.
                return Ok(None);
            };
            let ttl = self.clamp(req.ttl);
            // The door is forgotten by `door`, once let go.
            let cancel = self.cancel_with(let_go.clone()).await;
            let taken = self
                .watch_then_take(door.get(), names, req, (k, wait), limit, cancel)
                .await?;
            if taken.got && taken.other.is_none() && taken.admin == Some(1) {
                // Granted between the send and now: the ttl counts from
                // the answer. The statement let the door go.
                let session = door.keep();
                let valid_until = lease_deadline(Instant::now(), ttl);
                return self.taken(req, names, session, &names.door, taken, ttl, valid_until);
            }
            if taken.other.is_some() || taken.admin != Some(1) {
                // Refused: the door is let go as `door` is dropped, and
                // forgotten only then (no other wait takes the session
                // before), so `taken` forgets no name here.
                let session = door.get().clone();
                return self.taken(req, names, session, "", taken, ttl, Instant::now());
            }
            k = (k + 1) % req.permits.max(1);
        }
    }

    /// The head waiter's watch of slot `watch.0` (waiting `watch.1`, at
    /// most `limit`), then, while its caller is there, the take with what
    /// the watch answered (the slot, if granted, is the permit), on
    /// `session`, which holds the door; the take lets the door go with a
    /// grant. Left as `cancel` says if the caller leaves during the watch;
    /// a grant whose caller left during the take is given back.
    async fn watch_then_take(
        &self,
        session: &Arc<Session>,
        names: &PermitNames,
        req: &PermitRequest,
        (k, wait): (usize, Wait),
        limit: Option<Duration>,
        cancel: Cancel,
    ) -> Result<Taken, LockError> {
        let watch = Statements::permit_watch(names, k, wait);
        let (statements, names_of_take) = (self.statements.clone(), names.clone());
        let (ttl_cap, permits) = (self.config.session.session_timeout, req.permits);
        let then: Then<Taken> = Box::new(move |conn, got| {
            let take = Take {
                watch: Some((k, got)),
                door: true,
            };
            let (sql, undo) = take_statements(&statements, ttl_cap, &names_of_take, permits, take);
            Box::pin(taken_by(conn, sql, undo))
        });
        let take_limit = self.config.session.timeout + super::permits::ADMIN_WAIT;
        session
            .wait_then(
                limit,
                watch,
                cancel,
                (then, take_limit),
                slot_given_back(names, None),
            )
            .await
            .map_err(|e| failed(&self.shown, e))
    }

    /// A `GET_LOCK` wait until `deadline`, at most `at_most`, and the
    /// request's bound (the wait and the request timeout); `None` once
    /// the deadline has passed.
    fn wait_left(
        &self,
        deadline: Option<Instant>,
        at_most: Option<Duration>,
    ) -> Option<(Wait, Option<Duration>)> {
        let left = match deadline {
            None => None,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                Some(left)
            }
        };
        let span = match (left, at_most) {
            (Some(l), Some(m)) => Some(l.min(m)),
            (l, m) => l.or(m),
        };
        Some(match span {
            None => (Wait::Forever, None),
            Some(span) => (
                Wait::For(span),
                Some(span + self.config.session.timeout + super::permits::ADMIN_WAIT),
            ),
        })
    }
}

/// The first slot a head waiter watches: chosen at random, so that head
/// waiters of several semaphores' instances do not all watch slot 0.
fn first_watch(permits: usize) -> usize {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    usize::from(u16::from_le_bytes(b)) % permits.max(1)
}
