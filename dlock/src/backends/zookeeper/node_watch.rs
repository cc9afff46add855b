//! Hearing a held node's loss at once: an exists-watch on each held node
//! that rings the backend's loss alarm (`LockBackend::loss_alarm`) when the
//! node is deleted behind our back (`zkCli delete`, Curator, an operator's
//! `force_release`), changed, or its session ends, so the watchdog renews
//! at once and the renewal's read reports the lease lost, instead of at the
//! next renewal (up to a third of the ttl later; issue 65).
//!
//! A ZooKeeper watch is cheap: an entry in the server's watch table and a
//! path in the client's, riding the session's one connection (no request
//! of its own after it is set; the client sets it again after a
//! reconnection). It is set by an `exists` [`WATCH_AFTER`] after the grant
//! (a short critical section sends none), so a node deleted between the
//! grant and the watch is seen when it is set (no stat).
//! The watch ends with the lease's record (release, reaping): the release's
//! delete fires it on the server and nobody listens any more.

use std::time::Duration;

use zookeeper_client::{Client, EventType};

/// How long after the grant the watch is set. A lock held for less costs
/// no request beyond its create, listing and delete (the `exists` would be
/// a fourth request per cycle); a node deleted within this time is seen
/// when the watch is set (no stat), so a loss is heard at most this much
/// later than with a watch set at once.
const WATCH_AFTER: Duration = Duration::from_millis(50);

/// Rings `alarm`: a new value wakes the watchdog.
fn ring(alarm: &tokio::sync::watch::Sender<u64>) {
    alarm.send_modify(|n| *n = n.wrapping_add(1));
}

/// Watches the held node at `path` until `unwatched` says its record is gone.
pub(super) async fn watch_node(
    client: Client,
    path: String,
    alarm: tokio::sync::watch::Sender<u64>,
    mut unwatched: tokio::sync::oneshot::Receiver<()>,
) {
    tokio::select! {
        _ = tokio::time::sleep(WATCH_AFTER) => {}
        _ = &mut unwatched => return,
    }
    // Bounded: a data change sets the watch again; a few such changes of
    // our own node (no dlock client writes it) are an operator's, and the
    // renewal decides whether the node is still ours.
    for _ in 0..16 {
        let watcher = tokio::select! {
            set = client.check_and_watch_stat(&path) => match set {
                Ok((Some(_), watcher)) => watcher,
                // Gone already (deleted between the grant and the watch),
                // or the session ended: the renewal decides.
                Ok((None, _)) | Err(_) => {
                    tracing::debug!(%path, "a held node is gone, or its watch could not be set");
                    ring(&alarm);
                    return;
                }
            },
            _ = &mut unwatched => return,
        };
        let event = tokio::select! {
            event = watcher.changed() => event,
            _ = &mut unwatched => return,
        };
        tracing::debug!(%path, event = ?event.event_type, "a held node's watch fired");
        ring(&alarm);
        if event.event_type != EventType::NodeDataChanged {
            return;
        }
    }
}
