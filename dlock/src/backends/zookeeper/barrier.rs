//! Double barriers on ZooKeeper, in the layout of Curator's
//! `DistributedDoubleBarrier` at `/<prefix>/<escaped name>`, so dlock and
//! Curator members share one barrier:
//!
//! - A member is the EPHEMERAL node `<dir>/<uuid>` (no sequence; its data
//!   is the member's token): the session's end counts it out.
//! - `enter` sets an exists-watch on `<dir>/ready` before creating its node
//!   (Curator's order). If `ready` is there, the barrier is open: it passes
//!   at once. Otherwise it lists `<dir>`: with `parties` members (every
//!   child but `ready`) it creates the PERSISTENT `ready` node, which wakes
//!   every waiter's watch; with fewer it waits for that watch.
//! - `leave` deletes its own node, then, while members are left, watches
//!   the highest of them (sorted by name, as Curator) and looks again when
//!   it goes; once none is left it deletes `ready`, closing the barrier for
//!   the next round. Curator 5's own leave does the same; Curator 2's
//!   lowest member keeps its node until it is alone, which this waits for.
//! - A timed-out or dropped `enter` deletes its node (`Cleanup`), unlike
//!   Curator's, whose node stays until its `leave` or its session's end.
//! - With credentials and an ACL other than `open`, `<dir>`'s ACL (which
//!   decides who may delete a member) is checked as a lock directory's: one
//!   others made open is tightened, or the entry refused (`acl.rs`). Curator
//!   members then need the same credentials, as for a shared lock.

use std::time::Instant;

use async_trait::async_trait;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use super::cleanup::Cleanup;
use super::queue::new_uuid;
use super::{after_sync, representable, ZooKeeperBackend};
use crate::backend::{deadline, AcquireRequest, BarrierBackend, BarrierRequest, Lease, Renewal};
use crate::LockError;

/// The node whose presence opens the barrier (Curator's `READY_NODE`).
const READY: &str = "ready";

/// The members among `children`, sorted by name: every child but `ready`.
fn members(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| c != READY);
    children.sort();
    children
}

impl ZooKeeperBackend {
    /// `/<prefix>/<escaped name>`: the barrier `name`'s node, where Curator's
    /// `DistributedDoubleBarrier` with that path keeps its members.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if `name` is not a valid key.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181").await?;
    /// assert_eq!(zk.barrier_path("batch")?, "/dlock/batch");
    /// # Ok(()) }
    /// ```
    pub fn barrier_path(&self, name: &str) -> Result<String, LockError> {
        self.lock_path(name)
    }

    /// Creates our member node, and waits until the barrier opens. The
    /// caller bounds this by its deadline; dropping it deletes our node.
    async fn enter_member(&self, req: &BarrierRequest) -> Result<Lease, LockError> {
        let dir = self.barrier_path(&req.name)?;
        let ready = format!("{dir}/{READY}");
        let uuid = new_uuid()?;
        let path = format!("{dir}/{uuid}");
        let session = self.session().await?;
        let client = &session.client;
        // Armed before the create: dropped at any await, the node goes.
        let mut cleanup = Cleanup::new(&session, &dir, &uuid);
        cleanup.set_path(&path);
        let (mut open, mut watcher) = client
            .check_and_watch_stat(&ready)
            .await
            .map(|(stat, watcher)| (stat.is_some(), watcher))
            .map_err(|e| self.error(format_args!("cannot watch {ready}"), e))?;
        self.create_member(client, &dir, &path, req.token.as_bytes())
            .await?;
        if self.guards_dirs() {
            // The barrier's directory decides who may delete our member (a
            // delete is checked against the parent's ACL): one that others
            // made open is tightened, or the entry refused (the cleanup,
            // armed above, then deletes our node), as a lock's directory is.
            self.guard_dir(client, &dir, client.get_acl(&dir).await)
                .await?;
        }
        while !open {
            let children = client
                .list_children(&dir)
                .await
                .map_err(|e| self.error(format_args!("cannot list {dir}"), e))?;
            let members = members(children);
            if !members.contains(&uuid) {
                cleanup.disarm();
                return Err(LockError::backend(
                    self.shown.clone(),
                    format!("barrier member {path} vanished while waiting (session expired, or deleted by someone)"),
                ));
            }
            if members.len() >= req.parties {
                match client
                    .create(
                        &ready,
                        &[],
                        &CreateMode::Persistent.with_acls(self.node_acls()),
                    )
                    .await
                {
                    Ok(_) | Err(ZkError::NodeExists) => break,
                    Err(e) => return Err(self.error(format_args!("cannot create {ready}"), e)),
                }
            }
            // Woken by `ready`'s creation (the last member's), or by the
            // session's trouble: then the watch is set again.
            watcher.changed().await;
            (open, watcher) = client
                .check_and_watch_stat(&ready)
                .await
                .map(|(stat, watcher)| (stat.is_some(), watcher))
                .map_err(|e| self.error(format_args!("cannot watch {ready}"), e))?;
        }
        // A read behind a sync proves the session (and our node) alive on
        // the leader when it was sent: the lease starts then.
        let sent = Instant::now();
        let stat = after_sync(client, || client.check_stat(&path))
            .await
            .map_err(|e| self.error(format_args!("cannot read {path}"), e))?;
        let Some(stat) = stat else {
            cleanup.disarm();
            return Err(LockError::backend(
                self.shown.clone(),
                format!("barrier member {path} vanished as the barrier opened (session expired, or deleted by someone)"),
            ));
        };
        let as_lock = AcquireRequest {
            key: req.name.clone(),
            token: req.token.clone(),
            ttl: req.ttl,
        };
        let lease = self.lease(&as_lock, client, &path, &stat, (sent, Instant::now()))?;
        self.remember(&lease, &session, cleanup);
        Ok(lease)
    }

    /// Creates the member node `path`, and `dir` (containers) if missing.
    async fn create_member(
        &self,
        client: &Client,
        dir: &str,
        path: &str,
        data: &[u8],
    ) -> Result<(), LockError> {
        let mode = CreateMode::Ephemeral.with_acls(self.node_acls());
        for _ in 0..3 {
            match client.create(path, data, &mode).await {
                Ok(_) => return Ok(()),
                // The directory is missing, or the server removed the empty
                // container between our mkdir and this create.
                Err(ZkError::NoNode) => self.make_dir(client, dir).await?,
                Err(ZkError::NoAuth) => return Err(self.not_permitted(client, dir).await),
                Err(e) => {
                    return Err(self.error(format_args!("cannot create barrier member {path}"), e))
                }
            }
        }
        Err(LockError::backend(
            self.shown.clone(),
            format!("could not create barrier member {path}: its directory kept vanishing"),
        ))
    }

    /// Waits until no member is left under the directory of `member`, then
    /// deletes `ready`.
    async fn members_gone(&self, member: &Lease) -> Result<(), LockError> {
        let dir = member
            .resource
            .rsplit_once('/')
            .map_or(member.resource.as_str(), |(dir, _)| dir)
            .to_owned();
        let session = self.session().await?;
        let client = &session.client;
        loop {
            let children = match client.list_children(&dir).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => Vec::new(),
                Err(e) => return Err(self.error(format_args!("cannot list {dir}"), e)),
            };
            let Some(highest) = members(children).pop() else {
                break;
            };
            let highest = format!("{dir}/{highest}");
            let (stat, watcher) = client
                .check_and_watch_stat(&highest)
                .await
                .map_err(|e| self.error(format_args!("cannot watch {highest}"), e))?;
            if stat.is_some() {
                watcher.changed().await;
            }
        }
        match client.delete(&format!("{dir}/{READY}"), None).await {
            Ok(()) | Err(ZkError::NoNode) => Ok(()),
            Err(e) => Err(self.error(format_args!("cannot delete {dir}/{READY}"), e)),
        }
    }
}

#[async_trait]
impl BarrierBackend for ZooKeeperBackend {
    async fn enter_barrier(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        // Dropping the wait at the deadline deletes our node (`Cleanup`).
        deadline::until(representable(deadline), async {
            self.enter_member(req).await.map(Some)
        })
        .await
        .unwrap_or(Ok(None))
    }

    async fn wait_all_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        deadline::until(representable(deadline), async {
            self.members_gone(member).await.map(|()| true)
        })
        .await
        .unwrap_or(Ok(false))
    }

    /// Member nodes are session nodes like lock nodes: the same read.
    async fn renew_members(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_nodes(leases).await
    }

    async fn remove_member(&self, lease: &Lease) -> Result<bool, LockError> {
        self.release_node(lease).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_every_child_but_ready_sorted() {
        let children = vec!["b".to_owned(), READY.to_owned(), "a".to_owned()];
        assert_eq!(members(children), vec!["a".to_owned(), "b".to_owned()]);
    }
}
