//! [`LockBackend`] for [`PostgresBackend`]: the trait's calls, each handed
//! to the code that does the work (waits in `waiting.rs`, the capabilities in
//! their own files).

use std::time::Instant;

use async_trait::async_trait;

use super::{advisory_key_in, lock, Pending, PostgresBackend};
use crate::backend::{AcquireRequest, Lease, LockBackend, Renewal};
use crate::{LockError, LockInfo};

#[async_trait]
impl LockBackend for PostgresBackend {
    fn describe(&self) -> String {
        self.shown.clone()
    }

    fn client_name(&self) -> Option<&str> {
        Some(
            self.config
                .client_name
                .as_deref()
                .unwrap_or_else(|| crate::backend::holder::default_client_name()),
        )
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.try_once(req).await
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let key = advisory_key_in(&self.config.prefix, &req.key);
        self.wait_for(key, deadline, &mut (self, req), |(backend, req)| {
            Box::pin(backend.try_once(req))
        })
        .await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_in_rounds(
            leases,
            |i, _| i,
            |session, at| self.renew_on(session, leases, at),
        )
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(h) = lock(&self.held).remove(&lease.token) else {
            return Ok(false);
        };
        if !h.session.is_alive() {
            return Ok(false);
        }
        let mut pending = Pending {
            session: Some(h.session.clone()),
            key: h.key,
        };
        let name = self.name_of(&lease.key);
        let row = self
            .bounded(
                h.session
                    .client
                    .query_one(&h.session.prepared.release, &[&h.key, &name, &lease.token]),
            )
            .await;
        let row = match row {
            Ok(row) => row,
            Err(_) if !h.session.is_alive() => {
                pending.disarm();
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        pending.disarm();
        h.session.unreserve(h.key);
        self.sweeper
            .maybe(&h.session, &self.statements.sweep, &self.shown);
        let unlocked: bool = row.get(0);
        let ours: i64 = row.get(1);
        Ok(unlocked && ours == 1)
    }

    fn capabilities(&self) -> crate::backend::Capabilities<'_> {
        crate::backend::Capabilities::all(self)
    }

    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.alarm.subscribe())
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.inspect_key(key).await
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        self.force_release_key(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, LockInfo)>, LockError> {
        self.list_keys(prefix).await
    }
}
