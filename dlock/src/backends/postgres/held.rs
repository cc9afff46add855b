//! The leases this backend holds, by owner token: the session each lives
//! on, and the reaper that unlocks a lease whose local deadline passed
//! without a renewal (renewal off, a leaked guard): the session would
//! otherwise keep the lock for as long as it lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use super::lock;
use super::session::Session;

/// One held lease.
pub(super) struct Held {
    pub(super) session: Arc<Session>,
    /// The advisory key.
    pub(super) key: i64,
    /// The lease's local deadline, moved by each renewal.
    pub(super) valid_until: Instant,
    /// Dropped with the entry: ends the reaper at once.
    _reaper: tokio::sync::oneshot::Sender<()>,
}

/// Held leases by owner token.
pub(super) type HeldMap = HashMap<String, Held>;

/// Records a granted lease and starts its reaper.
pub(super) fn remember(
    held: &Arc<Mutex<HeldMap>>,
    token: &str,
    session: Arc<Session>,
    key: i64,
    valid_until: Instant,
) {
    let (reaper, gone) = tokio::sync::oneshot::channel();
    lock(held).insert(
        token.to_owned(),
        Held {
            session,
            key,
            valid_until,
            _reaper: reaper,
        },
    );
    crate::background::spawn(reap(
        Arc::downgrade(held),
        token.to_owned(),
        valid_until,
        gone,
    ));
}

/// Unlocks the lease of `token` once its local deadline has passed without
/// a renewal.
async fn reap(
    held: Weak<Mutex<HeldMap>>,
    token: String,
    mut at: Instant,
    mut gone: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(at.into()) => {}
            _ = &mut gone => return,
        }
        let Some(map) = held.upgrade() else { return };
        let expired = {
            let mut map = lock(&map);
            match map.get(&token) {
                None => return,
                Some(h) if h.valid_until > Instant::now() => {
                    at = h.valid_until;
                    None
                }
                Some(_) => map.remove(&token),
            }
        };
        if let Some(h) = expired {
            tracing::debug!(key = h.key, "lease ran out without renewal; unlocking it");
            unlock_in_background(h.session, h.key);
            return;
        }
    }
}

/// Unlocks `key` on `session` (announcing the release) and forgets it
/// there, in the background. Behind whatever the session sent before, so
/// it also undoes a grant whose answer nobody awaited.
pub(super) fn unlock_in_background(session: Arc<Session>, key: i64) {
    crate::background::spawn(async move {
        if session.is_alive() {
            let unlock = async {
                session
                    .client
                    .query_one(&session.prepared.unlock, &[&key])
                    .await
            };
            match tokio::time::timeout(std::time::Duration::from_secs(10), unlock).await {
                Ok(Ok(_)) => {}
                // Unknown: end the session, so the server frees its locks.
                _ => session.close(),
            }
        }
        session.unreserve(key);
    });
}
