//! The nodes this backend holds: their records, the reaper that deletes a
//! node whose lease ran out without renewal, and the records of sessions
//! whose runtime is gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use super::cleanup::Cleanup;
use super::session::Session;
use super::{lock, ZooKeeperBackend};
use crate::backend::Lease;
use crate::backends::held_deadline::ran_out;

/// Held nodes by path.
pub(super) type HeldMap = HashMap<String, Held>;

/// One held node.
pub(super) struct Held {
    /// The session the node lives on (it may no longer be the current one).
    pub(super) session: Arc<Session>,
    /// The lease's local deadline, moved by each renewal. When it passes
    /// without one, the node is deleted (see [`reap`]).
    pub(super) valid_until: Instant,
    /// What deletes the node in the background if it is dropped unreleased.
    pub(super) cleanup: Cleanup,
    /// Dropped with the entry (release, reaping): ends the node's reaper
    /// task at once instead of leaving it asleep until the deadline.
    pub(super) _reaper: tokio::sync::oneshot::Sender<()>,
    /// Dropped with the entry, or taken before a release's delete: ends
    /// the node's watch (`node_watch.rs`), so our own delete does not ring
    /// the loss alarm.
    pub(super) watch: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ZooKeeperBackend {
    /// Records a granted node, and starts the task that deletes it if its
    /// local deadline passes without a renewal.
    ///
    /// The reaper runs on the session's runtime, not the caller's, so it
    /// outlives a guard whose runtime ended before the guard could be
    /// released there.
    pub(super) fn remember(&self, lease: &Lease, session: &Arc<Session>, cleanup: Cleanup) {
        let (reaper, gone) = tokio::sync::oneshot::channel();
        let (watch, unwatched) = tokio::sync::oneshot::channel();
        lock(&self.held).insert(
            lease.resource.clone(),
            Held {
                session: session.clone(),
                valid_until: lease.valid_until,
                cleanup,
                _reaper: reaper,
                watch: Some(watch),
            },
        );
        session.spawn(super::node_watch::watch_node(
            session.client.clone(),
            lease.resource.clone(),
            self.loss_alarm.clone(),
            unwatched,
        ));
        session.spawn(reap(
            Arc::downgrade(&self.held),
            lease.resource.clone(),
            lease.valid_until,
            gone,
        ));
    }

    /// Drops the entries of nodes whose session's runtime is gone. Their
    /// reapers died with that runtime, and nothing can reach the server
    /// through the session any more; the server deletes the nodes when it
    /// expires the session. Called when a new session opens, which is when
    /// a session found dead is replaced.
    pub(super) fn forget_dead_sessions(&self) {
        let dead: Vec<Held> = {
            let mut held = lock(&self.held);
            let paths: Vec<String> = held
                .iter()
                .filter(|(_, h)| !h.session.is_alive())
                .map(|(p, _)| p.clone())
                .collect();
            paths.iter().filter_map(|p| held.remove(p)).collect()
        };
        // Dropped outside the lock: a `Cleanup` may enter a runtime.
        drop(dead);
    }
}

/// Deletes the node at `path` once its local deadline has passed without a
/// renewal.
///
/// ZooKeeper keeps an ephemeral node for as long as the session lives, but a
/// dlock lease ends at its ttl when it is not renewed (renewal off, or a
/// holder whose watchdog cannot run): by then the guard reports the loss, so
/// the node must go too, or the key stays blocked by a lease nobody holds.
pub(super) async fn reap(
    held: Weak<Mutex<HeldMap>>,
    path: String,
    at: Instant,
    gone: tokio::sync::oneshot::Receiver<()>,
) {
    let expired = ran_out(held, &path, at, gone, |h: &Held| h.valid_until).await;
    if let Some(mut node) = expired {
        tracing::debug!(%path, "lease ran out without renewal; deleting its node");
        // Dropping an armed cleanup deletes the node in the background.
        node.cleanup.arm();
    }
}
