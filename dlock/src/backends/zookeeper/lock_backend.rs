//! [`LockBackend`] for [`ZooKeeperBackend`]: the trait's calls, each handed
//! to the file that does the work (locks in `lock.rs`, renewal in
//! `renew.rs`, the capabilities in their own files).

use std::time::Instant;

use async_trait::async_trait;

use super::order::Queue;
use super::ZooKeeperBackend;
use crate::backend::{AcquireRequest, Capabilities, Lease, LockBackend, Renewal};
use crate::LockError;

#[async_trait]
impl LockBackend for ZooKeeperBackend {
    fn describe(&self) -> String {
        self.shown.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let dir = self.lock_path(&req.key)?;
        self.try_queued(req, (&dir, Queue::Lock)).await
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let dir = self.lock_path(&req.key)?;
        self.acquire_queued(req, (&dir, Queue::Lock), deadline)
            .await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_nodes(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.release_node(lease).await
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            barrier: Some(self),
            latch: Some(self),
            ..Capabilities::all(self)
        }
    }

    /// Rung when a held node's watch fires (see `node_watch.rs`).
    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.loss_alarm.subscribe())
    }

    fn client_name(&self) -> Option<&str> {
        Some(
            self.config
                .client_name
                .as_deref()
                .unwrap_or(crate::backend::holder::default_client_name()),
        )
    }

    async fn inspect(&self, key: &str) -> Result<Option<crate::LockInfo>, LockError> {
        self.inspect_lock(key).await
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        self.force_release_lock(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, crate::LockInfo)>, LockError> {
        self.list_locks(prefix).await
    }
}
