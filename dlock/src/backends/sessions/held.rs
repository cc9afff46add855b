//! The leases a session backend holds, by owner token: the session each
//! lives on, the server's lock it is, and the reaper that lets a lease go
//! when its local deadline passed without a renewal (renewal off, a leaked
//! guard): the session would otherwise keep the lock for as long as it
//! lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::pool::PooledSession;

/// One held lease: on `session`, the server's lock `lock` (MySQL's lock
/// name; PostgreSQL's advisory key and its kind).
pub(crate) struct Held<S, L> {
    pub(crate) session: Arc<S>,
    pub(crate) lock: L,
    /// The lease's local deadline, moved by each renewal.
    pub(crate) valid_until: Instant,
    /// Dropped with the entry: ends the reaper at once.
    _reaper: tokio::sync::oneshot::Sender<()>,
}

/// Held leases by owner token.
pub(crate) type HeldMap<S, L> = HashMap<String, Held<S, L>>;

/// Records the lease of `token`, granted on `session`, and starts its
/// reaper: when the lease's local deadline passes without a renewal, it is
/// taken out of `held` and handed to `expired`, which lets the lock go.
pub(crate) fn remember<S, L>(
    held: &Arc<Mutex<HeldMap<S, L>>>,
    token: &str,
    session: Arc<S>,
    lock: L,
    valid_until: Instant,
    expired: impl FnOnce(Held<S, L>) + Send + 'static,
) where
    S: Send + Sync + 'static,
    L: Send + 'static,
{
    let entry = |reaper| Held {
        session,
        lock,
        valid_until,
        _reaper: reaper,
    };
    let deadline_of = |h: &Held<S, L>| h.valid_until;
    crate::backends::held_deadline::remember(held, token, valid_until, entry, deadline_of, expired);
}

/// Takes the record of `token` out of `held`, for its release: `None` if
/// the backend holds no such lease, or its session has ended (the server
/// freed the lock with it; the lease is not ours to release any more).
pub(crate) fn take_live<S: PooledSession, L>(
    held: &Mutex<HeldMap<S, L>>,
    token: &str,
) -> Option<Held<S, L>> {
    let h = held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(token)?;
    h.session.is_alive().then_some(h)
}
