//! The bounded pool of lock-holding sessions, for the backends whose server
//! ties a lock to the connection that took it (PostgreSQL's advisory locks,
//! MySQL's named locks).
//!
//! Such locks are re-entrant within their session, so each session keeps
//! the set of keys it holds or is asking for (reserved before the request
//! is sent): the backend never asks a session for a key it already has,
//! and a key held through every session is busy. A dead session's slot is
//! filled by a new session at the next reservation.

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::LockError;

/// What the pool needs of a backend's session.
pub(crate) trait PooledSession: Send + Sync {
    /// What a session holds: PostgreSQL's advisory keys, MySQL's lock names.
    type Key: Eq + Hash + Clone;

    /// Whether the session can still carry requests.
    fn is_alive(&self) -> bool;

    /// The keys held (or asked for) through this session.
    fn keys(&self) -> &Mutex<HashSet<Self::Key>>;

    /// Ends the session: the server frees every lock it held.
    fn close(self: &Arc<Self>);

    /// Speaks to the server on the session, so that it does not end a
    /// healthy session for silence, giving up after `within`. Answers
    /// whether the session lives on.
    fn ping(&self, within: Duration) -> impl Future<Output = bool> + Send;
}

/// Pings `session` every `every` (a third of the server's session timeout)
/// for as long as it lives.
pub(crate) async fn keep_alive<S: PooledSession>(session: Weak<S>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(s) = session.upgrade() else { return };
        if !s.is_alive() || !s.ping(every).await {
            return;
        }
    }
}

/// Every update under these mutexes is one insert, remove or assignment, so
/// a poisoned mutex still guards consistent data.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `session` as `Debug` shows it: the server's id of it (named `id_name`),
/// whether it is alive, and how many keys it holds.
pub(crate) fn debug<S: PooledSession>(
    session: &S,
    id_name: &str,
    id: &dyn std::fmt::Debug,
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    f.debug_struct("Session")
        .field(id_name, id)
        .field("alive", &session.is_alive())
        .field("keys", &lock(session.keys()).len())
        .finish()
}

/// The slots of a pool: a session each, or none yet.
pub(crate) struct Pool<S> {
    slots: Mutex<Vec<Option<Arc<S>>>>,
    /// One connect at a time, so two reservations do not fill one slot twice.
    connecting: tokio::sync::Mutex<()>,
}

impl<S> std::fmt::Debug for Pool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("slots", &lock(&self.slots).len())
            .finish_non_exhaustive()
    }
}

/// What [`Pool::reserve`] found.
pub(crate) enum Reserved<S> {
    /// The keys are reserved on this session.
    On(Arc<S>),
    /// Every session of the pool holds a key already (for this process's
    /// other leases), or none may take it: busy.
    Busy,
}

impl<S: PooledSession> Pool<S> {
    /// A pool of `size` slots, all empty.
    pub(crate) fn new(size: usize) -> Self {
        Pool {
            slots: Mutex::new(vec![None; size]),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// Puts an opened session in the first empty or dead slot.
    pub(crate) fn adopt(&self, session: Arc<S>) {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots
            .iter_mut()
            .find(|s| s.as_ref().is_none_or(|s| !s.is_alive()))
        {
            *slot = Some(session);
        }
    }

    /// Reserves `keys` on the least loaded session that has none of them
    /// (with `idle_only`, only on a session that holds nothing), opening a
    /// session in an empty (or dead) slot when that is the least loaded.
    /// `keys` empty: any live session, nothing reserved.
    pub(crate) async fn reserve<F, Fut>(
        &self,
        keys: &[S::Key],
        idle_only: bool,
        open: F,
    ) -> Result<Reserved<S>, LockError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Arc<S>, LockError>>,
    {
        let size = lock(&self.slots).len();
        // Bounded: each round either returns or fills one slot.
        for _ in 0..=size {
            let empty = {
                let slots = lock(&self.slots);
                let mut best: Option<(usize, usize)> = None; // (load, index)
                for (i, slot) in slots.iter().enumerate() {
                    let load = match slot {
                        Some(s) if s.is_alive() => {
                            let has = lock(s.keys());
                            if keys.iter().any(|k| has.contains(k))
                                || (idle_only && !has.is_empty())
                            {
                                continue;
                            }
                            has.len()
                        }
                        _ => 0,
                    };
                    if best.is_none_or(|(l, _)| load < l) {
                        best = Some((load, i));
                    }
                }
                let Some((_, i)) = best else {
                    return Ok(Reserved::Busy);
                };
                match &slots[i] {
                    Some(s) if s.is_alive() => {
                        lock(s.keys()).extend(keys.iter().cloned());
                        return Ok(Reserved::On(s.clone()));
                    }
                    _ => i,
                }
            };
            let _one = self.connecting.lock().await;
            let still_empty = lock(&self.slots)[empty]
                .as_ref()
                .is_none_or(|s| !s.is_alive());
            if still_empty {
                let session = open().await?;
                lock(&self.slots)[empty] = Some(session);
            }
        }
        Ok(Reserved::Busy)
    }

    /// The least loaded live session, if any; none is opened and nothing is
    /// reserved (for a short statement that must not cost a connection:
    /// MySQL's `KILL QUERY`, PostgreSQL's `pg_cancel_backend`).
    pub(crate) fn live(&self) -> Option<Arc<S>> {
        lock(&self.slots)
            .iter()
            .flatten()
            .filter(|s| s.is_alive())
            .min_by_key(|s| lock(s.keys()).len())
            .cloned()
    }

    /// Closes every session (the backend is dropped).
    pub(crate) fn close_all(&self) {
        for s in lock(&self.slots).iter().flatten() {
            s.close();
        }
    }
}
