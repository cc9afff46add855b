//! A backend with locks and no capability (no semaphores, no read-write
//! locks, no multi-key call), for the unit tests of the errors a facade
//! gives on such a backend.

use std::time::Instant;

use crate::backend::{AcquireRequest, Lease, LockBackend, Renewal};
use crate::backends::memory::MemoryBackend;
use crate::LockError;

/// The memory backend's locks, described as `locks-only://`.
#[derive(Debug, Default)]
pub(crate) struct LocksOnly(MemoryBackend);

#[async_trait::async_trait]
impl LockBackend for LocksOnly {
    fn describe(&self) -> String {
        "locks-only://".to_owned()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.0.try_acquire(req).await
    }
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.0.acquire(req, deadline).await
    }
    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.0.renew(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.0.release(lease).await
    }
}
