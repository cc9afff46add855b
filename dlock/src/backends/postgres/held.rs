//! The leases this backend holds, by owner token: the session each lives
//! on, and the reaper that unlocks a lease whose local deadline passed
//! without a renewal (renewal off, a leaked guard): the session would
//! otherwise keep the lock for as long as it lives.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::session::Session;
use crate::backends::sessions;
use crate::backends::sessions::pool::PooledSession;

/// What kind of advisory lock a lease (or a key being undone) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// A plain lock: the `bigint` form.
    Plain,
    /// A read lease of a read-write lock: the two-`int4` form, shared.
    Read,
    /// A write lease of a read-write lock: the two-`int4` form, exclusive.
    Write,
    /// The writer-intent key of the read-write lock whose lock key is
    /// given (announced when it is let go): two-`int4`, exclusive.
    Intent(i64),
    /// The writer-intent key taken shared by a reader's attempt (it lets it
    /// go in the same statement; undone only if that statement was cut).
    IntentShared,
    /// A semaphore's permit: its slots start at `base`, its count marker is
    /// (`mark`, `count`). Undone by letting go every slot of the semaphore
    /// the session holds (one at most: a session carries one permit or
    /// attempt per semaphore) and the marker.
    Permit { base: i64, mark: i32, count: i32 },
}

impl Hold {
    /// What the lease of advisory key `key` reserves on its session.
    pub(super) fn reserved(self, key: i64) -> i64 {
        match self {
            Hold::Permit { base, .. } => permit_reservation(base),
            _ => key,
        }
    }
}

/// What a semaphore's permit or attempt reserves on its session (a local
/// name only, never sent): one per semaphore per session.
pub(super) fn permit_reservation(base: i64) -> i64 {
    base ^ i64::MIN
}

/// The advisory lock a lease holds: its key, and which kind of lock it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Advisory {
    pub(super) key: i64,
    pub(super) hold: Hold,
}

/// One held lease.
pub(super) type Held = sessions::held::Held<Session, Advisory>;

/// Held leases by owner token.
pub(super) type HeldMap = sessions::held::HeldMap<Session, Advisory>;

/// Records a granted lease and starts its reaper, which unlocks it when
/// the lease's local deadline passes without a renewal.
pub(super) fn remember(
    held: &Arc<Mutex<HeldMap>>,
    token: &str,
    session: Arc<Session>,
    key: i64,
    hold: Hold,
    valid_until: Instant,
) {
    let lock = Advisory { key, hold };
    sessions::held::remember(held, token, session, lock, valid_until, move |h| {
        tracing::debug!(key, "lease ran out without renewal; unlocking it");
        undo_in_background(h.session, vec![(key, hold)], vec![hold.reserved(key)]);
    });
}

/// Unlocks `key` on `session` (announcing the release) and forgets it
/// there, in the background. Behind whatever the session sent before, so
/// it also undoes a grant whose answer nobody awaited.
pub(super) fn unlock_in_background(session: Arc<Session>, key: i64) {
    undo_in_background(session, vec![(key, Hold::Plain)], vec![key]);
}

/// Unlocks each of `unlock` on `session` in order (announcing the
/// releases), then forgets the keys `forget` there, in the background,
/// behind whatever the session sent before. A key not held is harmless to
/// unlock (the server answers false); an unlock that fails or does not
/// answer ends the session, so the server frees its locks.
pub(super) fn undo_in_background(
    session: Arc<Session>,
    unlock: Vec<(i64, Hold)>,
    forget: Vec<i64>,
) {
    crate::lease::background::spawn(async move {
        for (key, hold) in unlock {
            if !session.is_alive() {
                break;
            }
            let client = &session.client;
            let rw = &session.prepared.rw;
            let token = &session.token;
            let answer = session.guarded(async {
                match hold {
                    Hold::Plain => {
                        client
                            .query_one(&session.prepared.unlock, &[&key, token])
                            .await
                    }
                    Hold::Read | Hold::IntentShared => {
                        client.query_one(&rw.unlock_shared, &[&key, token]).await
                    }
                    Hold::Write => client.query_one(&rw.unlock, &[&key, &key, token]).await,
                    Hold::Intent(main) => client.query_one(&rw.unlock, &[&key, &main, token]).await,
                    Hold::Permit { base, mark, count } => {
                        client
                            .query_one(
                                &session.prepared.permits.free,
                                &[&base, &mark, &count, token],
                            )
                            .await
                    }
                }
            });
            match tokio::time::timeout(std::time::Duration::from_secs(10), answer).await {
                Ok(Ok(_)) => {}
                // A full lock table refused the release's announcement
                // (after the unlock, which needs no room): the key is
                // free, and the session keeps every other lock it holds.
                Ok(Err(e)) if super::lock_table::is_full(&e) => {}
                // Unknown: end the session, so the server frees its locks.
                _ => session.close(),
            }
        }
        for key in forget {
            session.unreserve(key);
        }
    });
}
