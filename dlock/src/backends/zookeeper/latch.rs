//! Count-down latches on ZooKeeper: the count is the data (decimal text) of
//! the PERSISTENT node `/<prefix>-latches/<escaped name>`, which exists only
//! while the count is live: the count-down that reaches zero deletes it, so
//! a latch at zero keeps nothing on the server. The parent is a container
//! node (as a key's directory), which the server removes once it is empty.
//!
//! - `try_set_count` creates the node (`NodeExists`: a live count, refused;
//!   a node someone left at `0` is set with a versioned `setData`).
//! - `count_down` reads the node and writes `count - 1` with a versioned
//!   `setData`, or deletes it (versioned) at the last step: a
//!   compare-and-swap on the node's version, tried again on `BadVersion`
//!   (another writer came first), never below zero.
//! - The parent's ACL decides who may delete a latch node: with credentials
//!   and an ACL other than `open`, a count set in a parent others made open
//!   tightens it (or is refused and taken back), as a lock's directory is
//!   (`acl.rs`).
//! - Waiters share one exists/data watch per node in one backend, set by
//!   the first waiter and re-set after each event by a task that bumps a
//!   generation the waiters wait on; a waiter joins it before it reads the
//!   count, so a count-down between its read and its wait is not missed.
//!   The last waiter gone stops the task, whose dropped watcher removes the
//!   watch from the server (`removeWatches`).

use std::sync::{Arc, Weak};
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::oneshot;
use zookeeper_client::{Client, CreateMode, Error as ZkError, OneshotWatcher};

use super::{config, representable, ZooKeeperBackend};
use crate::backend::{deadline, LatchBackend};
use crate::backends::shared_watches::{SharedWatch, SharedWatches};
use crate::LockError;

/// How many times a write is tried against other writers before it gives
/// up (each try is one read and one versioned write).
const CAS_TRIES: usize = 1000;

/// The count a latch node's data says.
fn parse_count(data: &[u8]) -> Option<u64> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

impl ZooKeeperBackend {
    /// `/<prefix>-latches/<escaped name>`: the node whose data is the count
    /// of the latch `name` while it is live.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if `name` is not a valid key.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181").await?;
    /// assert_eq!(zk.latch_path("jobs/start")?, "/dlock-latches/jobs%2Fstart");
    /// # Ok(()) }
    /// ```
    pub fn latch_path(&self, name: &str) -> Result<String, LockError> {
        crate::backend::key::validate(name)?;
        Ok(format!(
            "/{}-latches/{}",
            self.config.prefix,
            config::escape_key(name)
        ))
    }

    /// The count at `path` and the node's version (`None`: no node, 0).
    async fn latch_read(
        &self,
        client: &Client,
        path: &str,
    ) -> Result<(u64, Option<i32>), LockError> {
        match client.get_data(path).await {
            Ok((data, stat)) => {
                let count = parse_count(&data).ok_or_else(|| {
                    LockError::backend(
                        self.shown.clone(),
                        format!(
                            "latch node {path} holds {:?}, not a count",
                            String::from_utf8_lossy(&data)
                        ),
                    )
                })?;
                Ok((count, Some(stat.version)))
            }
            Err(ZkError::NoNode) => Ok((0, None)),
            Err(e) => Err(self.error(format_args!("cannot read {path}"), e)),
        }
    }

    /// Creates the latch node with `count`: `Ok(false)` if it exists.
    async fn latch_create(
        &self,
        client: &Client,
        path: &str,
        count: u64,
    ) -> Result<bool, LockError> {
        let dir = path.rsplit_once('/').map_or("", |(dir, _)| dir);
        let mode = CreateMode::Persistent.with_acls(self.node_acls());
        for _ in 0..3 {
            match client
                .create(path, count.to_string().as_bytes(), &mode)
                .await
            {
                Ok(_) if self.guards_dirs() => {
                    // The latches' directory decides who may delete a latch
                    // (and so end its count for every waiter): one that
                    // others made open is tightened, or the count refused
                    // and our node taken back, as a lock's directory is.
                    let acl = client.get_acl(dir).await;
                    if let Err(refused) = self.guard_dir(client, dir, acl).await {
                        let _ = client.delete(path, None).await;
                        return Err(refused);
                    }
                    return Ok(true);
                }
                Ok(_) => return Ok(true),
                Err(ZkError::NodeExists) => return Ok(false),
                // The directory is missing, or the server removed the empty
                // container between our mkdir and this create.
                Err(ZkError::NoNode) => self.make_dir(client, dir).await?,
                Err(ZkError::NoAuth) => return Err(self.not_permitted(client, dir).await),
                Err(e) => return Err(self.error(format_args!("cannot create {path}"), e)),
            }
        }
        Err(LockError::backend(
            self.shown.clone(),
            format!("could not create latch node {path}: its directory kept vanishing"),
        ))
    }

    /// The shared watch of `path`, set on the server.
    async fn latch_watch(&self, path: &str) -> Result<Arc<SharedWatch>, LockError> {
        let open = |shared| self.open_latch_watch(path, shared);
        self.latch_watches.join(path, open).await
    }

    /// Sets the first watch of `path` and starts the task that sets it
    /// again after each event, until the returned sender is dropped.
    async fn open_latch_watch(
        &self,
        path: &str,
        shared: Weak<SharedWatch>,
    ) -> Result<oneshot::Sender<()>, LockError> {
        let session = self.session().await?;
        let client = session.client.clone();
        let (_, watcher) = client
            .check_and_watch_stat(path)
            .await
            .map_err(|e| self.error(format_args!("cannot watch {path}"), e))?;
        let (stop, stopped) = oneshot::channel::<()>();
        crate::lease::background::spawn_daemon(rewatch(
            client,
            path.to_owned(),
            watcher,
            (shared, Arc::downgrade(&self.latch_watches)),
            stopped,
        ));
        Ok(stop)
    }
}

/// Waits for the watch's event, sets the watch again and tells the waiters,
/// until `stopped` (the last waiter is gone: dropping the watcher removes
/// it from the server) or the watch cannot be set again (the session
/// ended: the entry goes, and the waiters read again and open a new one).
async fn rewatch(
    client: Client,
    path: String,
    mut watcher: OneshotWatcher,
    (shared, watches): (Weak<SharedWatch>, Weak<SharedWatches>),
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        let changed = watcher.changed();
        tokio::pin!(changed);
        tokio::select! {
            _ = &mut stopped => return,
            event = &mut changed => {
                tracing::trace!(%path, event = ?event.event_type, "a latch node's watch fired");
            }
        }
        let set = tokio::select! {
            _ = &mut stopped => return,
            set = client.check_and_watch_stat(&path) => set,
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match set {
            Ok((_, next)) => {
                watcher = next;
                shared.bump();
            }
            Err(e) => {
                tracing::debug!(%path, error = %e, "a latch node's watch could not be set again");
                if let Some(watches) = watches.upgrade() {
                    watches.forget(&path, &shared);
                }
                shared.bump();
                return;
            }
        }
    }
}

#[async_trait]
impl LatchBackend for ZooKeeperBackend {
    async fn try_set_count(&self, name: &str, count: u64) -> Result<bool, LockError> {
        let path = self.latch_path(name)?;
        let session = self.session().await?;
        let client = &session.client;
        for _ in 0..CAS_TRIES {
            if self.latch_create(client, &path, count).await? {
                return Ok(true);
            }
            // A node at 0 (left by someone else's writer) is not a live count.
            match self.latch_read(client, &path).await? {
                (_, None) => continue,
                (0, Some(version)) => {
                    match client
                        .set_data(&path, count.to_string().as_bytes(), Some(version))
                        .await
                    {
                        Ok(_) => return Ok(true),
                        Err(ZkError::BadVersion | ZkError::NoNode) => continue,
                        Err(e) => return Err(self.error(format_args!("cannot set {path}"), e)),
                    }
                }
                (_, Some(_)) => return Ok(false),
            }
        }
        Err(self.lost_to_others("try_set_count", name))
    }

    async fn count_down(&self, name: &str) -> Result<(), LockError> {
        let path = self.latch_path(name)?;
        let session = self.session().await?;
        let client = &session.client;
        for _ in 0..CAS_TRIES {
            let (count, Some(version)) = self.latch_read(client, &path).await? else {
                return Ok(());
            };
            let written = if count <= 1 {
                client.delete(&path, Some(version)).await
            } else {
                client
                    .set_data(&path, (count - 1).to_string().as_bytes(), Some(version))
                    .await
                    .map(drop)
            };
            match written {
                Ok(()) => return Ok(()),
                // Another writer came first: read again.
                Err(ZkError::BadVersion | ZkError::NoNode) => continue,
                Err(e) => return Err(self.error(format_args!("cannot count down {path}"), e)),
            }
        }
        Err(self.lost_to_others("count_down", name))
    }

    async fn count(&self, name: &str) -> Result<u64, LockError> {
        let path = self.latch_path(name)?;
        let session = self.session().await?;
        let client = &session.client;
        // Behind a sync: on an ensemble, a follower may not have applied
        // another client's count-down yet.
        client
            .sync("/")
            .await
            .map_err(|e| self.error(format_args!("cannot sync before reading {path}"), e))?;
        Ok(self.latch_read(client, &path).await?.0)
    }

    async fn wait_zero(&self, name: &str, deadline: Option<Instant>) -> Result<bool, LockError> {
        let path = self.latch_path(name)?;
        // Read before the deadline counts: a wait of zero still answers.
        let session = self.session().await?;
        if self.latch_read(&session.client, &path).await?.0 == 0 {
            return Ok(true);
        }
        let waited = deadline::until(representable(deadline), async {
            loop {
                let shared = self.latch_watch(&path).await?;
                let mut changes = shared.subscribe();
                let session = self.session().await?;
                if self.latch_read(&session.client, &path).await?.0 == 0 {
                    return Ok::<(), LockError>(());
                }
                // The sender lives in `shared`, held here: never closed.
                let _ = changes.changed().await;
            }
        })
        .await;
        match waited {
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }
}

impl ZooKeeperBackend {
    fn lost_to_others(&self, what: &str, name: &str) -> LockError {
        LockError::backend(
            self.shown.clone(),
            format!("{what} of latch `{name}` lost {CAS_TRIES} compare-and-swaps in a row to other writers"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse_as_decimal_text() {
        assert_eq!(parse_count(b"42"), Some(42));
        assert_eq!(parse_count(b" 7\n"), Some(7));
        assert_eq!(parse_count(b"x"), None);
        assert_eq!(parse_count(b"-1"), None);
    }
}
