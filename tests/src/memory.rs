//! The conformance fixture of the in-process backend.

use std::sync::Arc;
use std::time::Instant;

use dlock::backend::{AcquireRequest, Lease, Renewal};
use dlock::backends::memory::MemoryBackend;
use dlock::{LockBackend, LockError};

use crate::conformance::Fixture;

/// One in-process "server" that hands out distinct clients, so that two
/// clients are two processes as far as the core is concerned (separate local
/// queues and watchdogs) and contention goes through the backend itself.
#[derive(Debug, Default)]
pub struct MemoryFixture {
    server: Arc<MemoryBackend>,
}

/// A client of the shared in-process server.
#[derive(Debug)]
struct Client(Arc<MemoryBackend>);

#[async_trait::async_trait]
impl LockBackend for Client {
    fn describe(&self) -> String {
        self.0.describe()
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

#[async_trait::async_trait]
impl Fixture for MemoryFixture {
    async fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(Client(self.server.clone()))
    }

    async fn steal(&self, key: &str) {
        assert!(self.server.force_expire(key), "no lease on {key} to steal");
    }

    fn short_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(400)
    }
}
