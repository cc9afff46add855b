//! Read-write locks on ZooKeeper (`RwBackend`), in Apache Curator's
//! `InterProcessReadWriteLock` layout: read and write nodes in one queue
//! under `/<prefix>-rw/<escaped key>`, taken, waited for, renewed and
//! released by the same code as lock nodes; only the node's name and the
//! rule of whose turn it is differ (`order.rs`).
//!
//! # Why a read's `czxid` is a sound fence
//!
//! Each lease's fencing token is its own node's `czxid`, as for a lock. In
//! one directory, sequence order is creation order is `czxid` order, and a
//! node exists without a break from its create until its delete (an
//! ephemeral node never comes back). Call a lease granted at the listing
//! that showed its turn; that listing held our own node (checked) and every
//! node created before it that still existed.
//!
//! - Write W and read R, with R's node created before W's: W's turn needs
//!   no node before it, so R's node was gone at W's listing; R's node
//!   existed at R's own listing, so R was granted before W.
//! - R's node created after W's: R's turn needs no write node before it, so
//!   W's node was gone at R's listing, and W was granted before R.
//!
//! So a read's token is above the token of every write granted before it
//! and below the token of every write granted after it, and the same
//! argument between two writes makes write tokens strictly increase. (A
//! directory that the server removed once empty and created again restarts
//! its sequences, but not the zxids, and no node of the old one is left to
//! compare with.) A read's token is its own node's `czxid`, not the token of
//! the write it follows: it lies between that write's and the next one's.

use std::time::Instant;

use async_trait::async_trait;

use super::order::Queue;
use super::{config, ZooKeeperBackend};
use crate::backend::{AcquireRequest, Lease, Renewal, RwBackend, RwMode, RwRequest};
use crate::LockError;

impl ZooKeeperBackend {
    /// The node under which the read and write nodes of the read-write lock
    /// `key` queue, relative to the URL's chroot:
    /// `/<prefix>-rw/<escaped key>`.
    ///
    /// This is the path to give Curator's `InterProcessReadWriteLock` (with
    /// the same chroot as namespace) to lock the same key from Java. It is
    /// apart from [`lock_path`](Self::lock_path): a read-write lock and a
    /// plain lock of one key are separate objects, and do not exclude each
    /// other.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if `key` is not a valid lock key.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181").await?;
    /// // Java: new InterProcessReadWriteLock(curator, "/dlock-rw/prices%2Feu")
    /// assert_eq!(zk.rw_lock_path("prices/eu")?, "/dlock-rw/prices%2Feu");
    /// # Ok(()) }
    /// ```
    pub fn rw_lock_path(&self, key: &str) -> Result<String, LockError> {
        crate::backend::key::validate(key)?;
        Ok(format!(
            "/{}-rw/{}",
            self.config.prefix,
            config::escape_key(key)
        ))
    }
}

/// The lock request a read or write lease is taken with: key, token and
/// ttl; the mode chooses the node's name and rule, not the request.
fn as_lock_request(req: &RwRequest) -> AcquireRequest {
    AcquireRequest {
        key: req.key.clone(),
        token: req.token.clone(),
        ttl: req.ttl,
    }
}

#[async_trait]
impl RwBackend for ZooKeeperBackend {
    async fn try_acquire_rw(&self, req: &RwRequest) -> Result<Option<Lease>, LockError> {
        let dir = self.rw_lock_path(&req.key)?;
        self.try_queued(&as_lock_request(req), (&dir, Queue::of(req.mode)))
            .await
    }

    async fn acquire_rw(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let dir = self.rw_lock_path(&req.key)?;
        let queue = (dir.as_str(), Queue::of(req.mode));
        self.acquire_queued(&as_lock_request(req), queue, deadline)
            .await
    }

    /// Read and write nodes are session nodes like lock nodes: the same
    /// read behind a `sync`, whatever the mode.
    async fn renew_rw(&self, _mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_nodes(leases).await
    }

    /// The delete of the node; its deletion wakes whoever watches it.
    async fn release_rw(&self, _mode: RwMode, lease: &Lease) -> Result<bool, LockError> {
        self.release_node(lease).await
    }
}
