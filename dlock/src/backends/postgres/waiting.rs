//! A wait on the server: one attempt on a free session, the attempts repeated
//! until a release's notification or the re-check timer grants the key, and
//! the renewal of leases on one session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::listener::Listener;
use super::session::{Reserved, Session};
use super::{advisory_key_in, held, listener, Pending, PostgresBackend, RECHECK};
use crate::backend::{lease_deadline, AcquireRequest, Lease};
use crate::backends::sessions;
use crate::LockError;

impl PostgresBackend {
    /// A waiting session of its own for a wait in the server's queue,
    /// reserved under the advisory key `name`: `None` when none is idle (every one serves
    /// another wait, or none could be opened), and the caller re-checks on
    /// notifications instead (`wait_for`).
    pub(super) async fn idle_waiting_session(&self, name: i64) -> Option<Arc<Session>> {
        match self
            .sessions
            .waiting
            .reserve(&[name], false, || self.open_session())
            .await
        {
            Ok(Reserved::On(session)) if session.load() == 1 => Some(session),
            Ok(Reserved::On(session)) => {
                session.unreserve(name);
                None
            }
            Ok(Reserved::Busy) => None,
            Err(e) => {
                tracing::debug!(error = %e, "PostgreSQL waiting session could not connect; re-checking instead");
                None
            }
        }
    }

    /// Runs `attempt` on `state` (what the attempts need, and what they
    /// carry from one to the next) until it gives a lease, or `Ok(None)` once
    /// `deadline` passes: the wait of a lock, a read-write lock or a
    /// semaphore whose advisory key is `key`. A release's notification on
    /// `key` wakes it; the re-check timer too, since a lock freed by another
    /// client announces nothing.
    pub(super) async fn wait_for<S: Send>(
        &self,
        key: i64,
        deadline: Option<Instant>,
        state: &mut S,
        attempt: impl for<'s> Fn(&'s mut S) -> Attempt<'s> + Send,
    ) -> Result<Option<Lease>, LockError> {
        let waiting = self.waiters.register(key);
        loop {
            // Listening before the attempt: a release after it is not missed.
            self.ensure_listener().await;
            let notified = waiting.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let Some(answer) = crate::backend::deadline::until(deadline, attempt(state)).await
            else {
                return Ok(None);
            };
            if let Some(lease) = answer? {
                return Ok(Some(lease));
            }
            let Some(nap) = recheck_at(deadline) else {
                return Ok(None);
            };
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(nap.into()) => {}
            }
        }
    }

    /// Makes sure the listening connection is up; false if it cannot be.
    /// A new one is opened by a task of its own, which keeps it: a waiter
    /// dropped meanwhile does not cut the connection mid-setup (that cost
    /// a connection per cancelled first wait, and a "connection reset"
    /// line in the server's log).
    pub(super) async fn ensure_listener(&self) -> bool {
        if self
            .listener
            .lock()
            .await
            .as_ref()
            .is_some_and(Listener::is_alive)
        {
            return true;
        }
        let (slot, config, shown, waiters) = (
            self.listener.clone(),
            self.config.clone(),
            self.shown.clone(),
            Arc::downgrade(&self.waiters),
        );
        let (up, heard) = tokio::sync::oneshot::channel();
        crate::lease::background::spawn(async move {
            let mut listener = slot.lock().await;
            let alive = listener.as_ref().is_some_and(Listener::is_alive)
                || match Listener::open(&config, &shown, waiters.clone()).await {
                    Ok(new) => {
                        *listener = Some(new);
                        if let Some(waiters) = waiters.upgrade() {
                            listener::listening_again(&waiters);
                        }
                        true
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "PostgreSQL listener could not connect; waiters re-check on a timer");
                        false
                    }
                };
            let _ = up.send(alive);
        });
        // Not sent: the task was dropped unrun (after `shutdown`).
        heard.await.unwrap_or(false)
    }

    /// A plain lock granted on `session` (a try, or a wait in the lock's queue): remembered as
    /// held there, and its lease: the fence read from the grant's `row`
    /// (its second column), the ttl counted from `counted_from`.
    pub(super) fn granted_plain(
        &self,
        req: &AcquireRequest,
        session: Arc<Session>,
        key: i64,
        ttl: Duration,
        row: &tokio_postgres::Row,
        counted_from: Instant,
    ) -> Lease {
        let fence: Option<i64> = row.get(1);
        let valid_until = lease_deadline(counted_from, ttl);
        held::remember(
            &self.held,
            &req.token,
            session,
            key,
            held::Hold::Plain,
            valid_until,
        );
        let resource = format!("pg_advisory_lock({key})");
        sessions::lease(req, ttl, fence, valid_until, resource)
    }

    /// One attempt: a free session, `pg_try_advisory_lock` and the fence.
    pub(super) async fn try_once(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let key = advisory_key_in(&self.config.prefix, &req.key);
        let session = match self
            .sessions
            .pool
            .reserve(&[key], false, || self.open_session())
            .await?
        {
            Reserved::On(session) => session,
            Reserved::Busy => return Ok(None),
        };
        let mut pending = Pending {
            session: Some(session.clone()),
            key,
        };
        let ttl = self.clamp(req.ttl);
        let name = self.name_of(&req.key);
        let secs = ttl.as_secs_f64();
        let sent = Instant::now();
        let row = self
            .bounded_acquire(session.guarded(session.client.query_one(
                &session.prepared.acquire,
                &[&key, &name, &req.token, &secs, &session.token],
            )))
            .await?;
        pending.disarm();
        let granted: bool = row.get(0);
        if !granted {
            session.unreserve(key);
            return Ok(None);
        }
        let lease = self.granted_plain(req, session, key, ttl, &row, sent);
        Ok(Some(lease))
    }
}

/// When a waiter whose try was refused tries again with no release
/// announced (the re-check, jittered so that waiters spread out), at the
/// latest at `deadline`; `None` once the deadline has passed.
pub(super) fn recheck_at(deadline: Option<Instant>) -> Option<Instant> {
    let jitter = Duration::from_millis(u64::from(rand_byte()) * 2);
    let nap = Instant::now() + RECHECK - Duration::from_millis(256) + jitter;
    match deadline {
        Some(d) if Instant::now() >= d => None,
        Some(d) => Some(nap.min(d)),
        None => Some(nap),
    }
}

/// One attempt of a wait (see `PostgresBackend::wait_for`), borrowing its
/// state.
type Attempt<'s> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<Lease>, LockError>> + Send + 's>,
>;

/// A random byte, for jitter.
pub(super) fn rand_byte() -> u8 {
    let mut b = [0u8; 1];
    let _ = getrandom::fill(&mut b);
    b[0]
}
