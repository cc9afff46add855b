//! [`LockBackend`] for [`PostgresBackend`]: the trait's calls, each handed
//! to the code that does the work (waits in `waiting.rs`, the capabilities in
//! their own files).

use std::time::Instant;

use async_trait::async_trait;

use super::{Pending, PostgresBackend};
use crate::backend::{AcquireRequest, Lease, LockBackend, Renewal};
use crate::backends::sessions;
use crate::backends::sessions::pool::PooledSession;
use crate::{LockError, LockInfo};

#[async_trait]
impl LockBackend for PostgresBackend {
    fn describe(&self) -> String {
        self.shown.clone()
    }

    fn client_name(&self) -> Option<&str> {
        Some(self.config.session.client_name())
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.try_once(req).await
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.acquire_in_turn(req, deadline).await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_plain(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(h) = sessions::held::take_live(&self.held, &lease.token) else {
            return Ok(false);
        };
        let mut pending = Pending {
            session: Some(h.session.clone()),
            key: h.lock.key,
        };
        let name = self.name_of(&lease.key);
        let released = self
            .release_on(&h.session, h.lock.key, &name, &lease.token)
            .await;
        let released = match released {
            Ok(released) => released,
            Err(_) if !h.session.is_alive() => {
                pending.disarm();
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        pending.disarm();
        h.session.unreserve(h.lock.key);
        let sweep = &self.statements.sweep;
        super::retention::sweep_if_due(&self.sessions.sweeper, &h.session, sweep, &self.shown);
        Ok(released)
    }

    fn capabilities(&self) -> crate::backend::Capabilities<'_> {
        crate::backend::Capabilities {
            latch: Some(self),
            barrier: Some(self),
            ..crate::backend::Capabilities::all(self)
        }
    }

    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.sessions.alarm.subscribe())
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
