//! The keys this backend holds: their records, their release, and the
//! clean-up that makes a key whose release never comes leave the server by
//! its own ttl even while other keys keep the session lease alive.
//!
//! Two rules keep a key name (`<prefix>/<key>/<lease-hex>`, the same for
//! every guard of one session) from ever serving two guards:
//!
//! - A record is only read or removed for the create revision it was made
//!   for: a newer guard may hold a new key under the same name.
//! - A release keeps the key's turn until its delete has been answered, in a
//!   background task if the release itself is dropped half-way, so the next
//!   acquisition of this backend starts after the old key is gone. (Were the
//!   turn lost anyway, with no runtime left to finish, the next enqueue finds
//!   the old key and deletes it by its revision; it never adopts it.)

use std::sync::Arc;
use std::time::Instant;

use super::client::revision_of_lease;
use super::queue::Turn;
use super::session::Session;
use super::{lock, Inner};
use crate::backend::Lease;
use crate::LockError;

/// A key we hold (a lock's or a permit's).
pub(super) struct Held {
    pub(super) session: Arc<Session>,
    /// The key's create revision (its fencing token).
    pub(super) revision: i64,
    /// The lease's local deadline as the core last heard it: past it, the
    /// core no longer counts on the key, and nor may we.
    valid_until: Instant,
    /// The watch of deletes (`deletions.rs`) or the key's own watcher
    /// (`key_watch.rs`) saw this key's name deleted after its create
    /// revision, or rewritten.
    pub(super) deleted: bool,
}

impl Inner {
    /// Records a won lease, and watches its key so that its loss is heard
    /// at once (see `key_watch.rs`).
    pub(super) fn hold(self: &Arc<Self>, lease: &Lease, session: Arc<Session>, revision: i64) {
        lock(&self.held).insert(
            lease.resource.clone(),
            Held {
                session,
                revision,
                valid_until: lease.valid_until,
                deleted: false,
            },
        );
        self.watch_key(&lease.resource, revision);
    }

    /// The session of `lease`, if this backend still holds its key.
    pub(super) fn held_session(&self, lease: &Lease) -> Option<Arc<Session>> {
        let revision = revision_of_lease(lease)?;
        lock(&self.held)
            .get(&lease.resource)
            .filter(|h| h.revision == revision)
            .map(|h| h.session.clone())
    }

    /// Whether a watch saw `lease`'s key deleted or rewritten.
    pub(super) fn seen_lost(&self, lease: &Lease) -> bool {
        let Some(revision) = revision_of_lease(lease) else {
            return false;
        };
        lock(&self.held)
            .get(&lease.resource)
            .is_some_and(|h| h.revision == revision && h.deleted)
    }

    /// The core was told `lease` is good until `valid_until`.
    pub(super) fn renewed(&self, lease: &Lease, valid_until: Instant) {
        let Some(revision) = revision_of_lease(lease) else {
            return;
        };
        if let Some(held) = lock(&self.held)
            .get_mut(&lease.resource)
            .filter(|h| h.revision == revision)
        {
            held.valid_until = valid_until;
        }
    }

    /// Forgets the record of `entry` if it is still the key made at `revision`.
    pub(super) fn forget(&self, entry: &str, revision: i64) -> bool {
        let mut held = lock(&self.held);
        if held.get(entry).is_some_and(|h| h.revision == revision) {
            held.remove(entry);
            drop(held);
            self.unwatch_key(entry);
            return true;
        }
        false
    }

    /// Whether a guard of this backend holds a key named `entry`, at any
    /// revision, valid or lapsed (its own release or loss deals with it).
    pub(super) fn holds_name(&self, entry: &str) -> bool {
        lock(&self.held).contains_key(entry)
    }

    /// Until when a guard of this backend counts on `entry` at `revision`,
    /// if it still does.
    pub(super) fn live_until(&self, entry: &str, revision: i64) -> Option<Instant> {
        lock(&self.held)
            .get(entry)
            .filter(|h| h.revision == revision && h.valid_until > Instant::now())
            .map(|h| h.valid_until)
    }

    /// Gives `lease` back: deletes its key if its create revision is still
    /// ours. `turn` is the lock key whose turn to keep until the delete is
    /// answered (`None` for permits: their key names are never reused).
    pub(super) async fn release_entry(
        self: &Arc<Self>,
        lease: &Lease,
        turn: Option<&str>,
    ) -> Result<bool, LockError> {
        let Some(revision) = revision_of_lease(lease) else {
            return Ok(false);
        };
        // No record: another call released it already, or the key is gone
        // (renewal refused, cleared past its deadline, or replaced by a newer
        // guard's key). Nothing of ours is left to delete.
        if !self.forget(&lease.resource, revision) {
            return Ok(false);
        }
        let mut releasing = Releasing {
            inner: self.clone(),
            entry: lease.resource.clone(),
            revision,
            // The turn is free unless a cleanup of an older acquisition
            // still runs; then the next acquisition waits for that one, and
            // finds our key gone or deletes it itself (by its revision).
            turn: turn.and_then(|key| self.try_turn(key)),
            settled: false,
        };
        let answer = self.delete_entry(&lease.resource, Some(revision)).await;
        // Answered or failed, an `Err` keeps trying in the background.
        releasing.settled = answer.is_ok();
        answer
    }

    /// Deletes the held keys that outlived their local deadline: their
    /// guards are gone without a release (dropped where no runtime could run
    /// it) or are past it without one, and the keep-alive that other keys
    /// need must not keep them on the server. (A key of a session that
    /// expired is gone already; its record goes all the same.)
    pub(super) async fn clear_expired(&self) {
        let now = Instant::now();
        let expired: Vec<(String, i64)> = lock(&self.held)
            .iter()
            .filter(|(_, h)| h.valid_until <= now)
            .map(|(entry, h)| (entry.clone(), h.revision))
            .collect();
        for (entry, revision) in expired {
            if self.delete_entry(&entry, Some(revision)).await.is_ok() {
                tracing::debug!(entry, "deleted a key that outlived its local deadline");
                self.forget(&entry, revision);
            }
        }
    }
}

/// A release whose delete is on its way. Dropped before the answer (the
/// `release` future was cancelled), it finishes in the background and keeps
/// the key's turn until then.
struct Releasing {
    inner: Arc<Inner>,
    entry: String,
    revision: i64,
    turn: Option<Turn>,
    settled: bool,
}

impl Drop for Releasing {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (inner, entry, revision) = (self.inner.clone(), self.entry.clone(), self.revision);
        let turn = self.turn.take();
        // On dlock's background runtime: the turn it keeps holds back this
        // backend's next acquisition of the key, on any runtime, so it must
        // not wait for the dropping runtime to be driven (nor die with it).
        // If it cannot run, the turn goes now: the next enqueue deletes the
        // old key by its revision before it creates its own.
        crate::lease::background::spawn(async move {
            inner.clean_up(&entry, Some(revision), false).await;
            drop(turn);
        });
    }
}
