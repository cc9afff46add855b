//! What the backends whose locks live in server sessions share (PostgreSQL's
//! advisory locks, MySQL's named locks: the server frees a session's locks
//! when the session ends): the bounded pool of sessions, the URL options
//! that size and time them, and the schedule of the idle-row sweep.
//!
//! Each backend keeps what its server does its own way: the session's
//! connection and requests, its statements, its TLS and its names.

pub(crate) mod held;
pub(crate) mod options;
pub(crate) mod pool;
pub(crate) mod sweep;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use self::options::SessionOptions;
use self::pool::{Pool, PooledSession, Reserved};
use self::sweep::SweepSchedule;
use crate::backend::{AcquireRequest, Lease};
use crate::LockError;

/// A backend's sessions: the pool tries run on (and whose locks carry the
/// leases), the pool waits queue on in the server, the alarm rung when a
/// session ends, and when idle rows are swept next. Dropped with its
/// backend, it closes every session, and the server frees their locks.
pub(crate) struct Sessions<S: PooledSession> {
    /// The sessions tries run on and leases live on.
    pub(crate) pool: Pool<S>,
    /// The sessions acquisitions wait in the server's queue on.
    pub(crate) waiting: Pool<S>,
    /// Rung when a session ends (`LockBackend::loss_alarm`).
    pub(crate) alarm: Arc<tokio::sync::watch::Sender<u64>>,
    /// When rows idle past `?fence_retention=` are swept next.
    pub(crate) sweeper: SweepSchedule,
}

impl<S: PooledSession> std::fmt::Debug for Sessions<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("pool", &self.pool)
            .field("waiting", &self.waiting)
            .finish_non_exhaustive()
    }
}

impl<S: PooledSession + 'static> Sessions<S> {
    /// Opens the first session with `open` (given the alarm it rings when it
    /// ends) on dlock's background runtime, and the pools around it, sized
    /// and timed by `options`. Returns the first session too, for the
    /// backend's first sweep.
    pub(crate) async fn open<F, Fut>(
        options: &SessionOptions,
        open: F,
    ) -> Result<(Self, Arc<S>), LockError>
    where
        F: FnOnce(Arc<tokio::sync::watch::Sender<u64>>) -> Fut,
        Fut: Future<Output = Result<Arc<S>, LockError>> + Send + 'static,
    {
        crate::lease::background::check()?;
        let alarm = Arc::new(tokio::sync::watch::channel(0).0);
        let first = crate::lease::background::run(open(alarm.clone())).await?;
        let sessions = Sessions {
            pool: Pool::new(options.sessions),
            waiting: Pool::new(options.sessions),
            alarm,
            sweeper: SweepSchedule::new(options.fence_retention),
        };
        sessions.pool.adopt(first.clone());
        Ok((sessions, first))
    }

    /// A live session for a read (inspect, list, force_release), opened
    /// with `open` if the pool has none; `shown` names the backend in the
    /// error when none can be had.
    pub(crate) async fn any<F, Fut>(&self, open: F, shown: &str) -> Result<Arc<S>, LockError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Arc<S>, LockError>>,
    {
        match self.pool.reserve(&[], false, open).await? {
            Reserved::On(session) => Ok(session),
            Reserved::Busy => Err(LockError::backend(shown, "no session could be opened")),
        }
    }
}

impl<S: PooledSession> Drop for Sessions<S> {
    fn drop(&mut self) {
        self.pool.close_all();
        self.waiting.close_all();
    }
}

/// The lease of a lock granted on a session for `req`: its fence, read
/// from the backend's counter row (a `BIGINT` that never goes below 1),
/// and `resource`, the server's name of the lock (for operators).
pub(crate) fn lease(
    req: &AcquireRequest,
    ttl: Duration,
    fence: Option<i64>,
    valid_until: std::time::Instant,
    resource: String,
) -> Lease {
    Lease {
        fencing_token: fence.and_then(|f| u64::try_from(f).ok()),
        ..Lease::unfenced(&req.key, &req.token, ttl, valid_until, resource)
    }
}
