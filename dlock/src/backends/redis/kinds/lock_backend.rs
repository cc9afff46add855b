//! [`LockBackend`] for [`RedisBackend`]: the trait's calls, each handed to
//! the file that does the work (locks here and in `waiter_queue.rs`, renewal
//! in `renew.rs`, the capabilities in their own files).

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::backend::refusal::About;
use crate::backend::{AcquireRequest, AllKeysBackend, Capabilities, Lease, LockBackend, Renewal};
use crate::backends::redis::calls::batching::ops::ReleaseOp;
use crate::backends::redis::calls::batching::{LaneBatchers, Turn};
use crate::backends::redis::protocol::scripts::{millis, KeyNames, RELEASE};
use crate::backends::redis::{check_ttl, protocol::scripts, Attempt, Conn, RedisBackend};
use crate::LockError;

#[async_trait]
impl LockBackend for RedisBackend {
    fn describe(&self) -> String {
        self.options.shown.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.key, &self.options.shown)?;
        let names = KeyNames::new(&self.options.prefix, &req.key).in_db(self.db);
        let ask = || async {
            Ok(match self.attempt_or_release(req, &names).await? {
                Attempt::Acquired(lease) => Some(lease),
                Attempt::Held(_) | Attempt::Behind(_) => None,
            })
        };
        let undo = |granted: Option<Lease>| async move {
            if let Some(lease) = granted {
                let _ = self.release_unbatched(&lease).await;
            }
        };
        let arm = || self.release_if_dropped(&names, &req.token);
        let answer = self
            .replicated(&req.key, (None, true), ask, arm, undo)
            .await;
        let granted = answer.map_err(|e| self.name_refusal(e, About::Lock(&req.key)))?;
        self.unless_redisson_holds(granted).await
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.key, &self.options.shown)?;
        // Behind Sentinel, through a failover within the wait (`ride_through.rs`).
        let granted = self.riding_failovers(req, deadline).await?;
        self.unless_redisson_holds(granted).await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let renewed = self.renew_locks(leases).await;
        self.name_refusals(leases, renewed, About::Lock)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let answer = self.release_lock(lease).await;
        answer.map_err(|e| self.name_refusal(e, About::Lock(&lease.key)))
    }

    async fn release_after(
        &self,
        lease: &Lease,
        remaining: Duration,
    ) -> Result<Option<bool>, LockError> {
        let names = KeyNames::new(&self.options.prefix, &lease.key);
        // At least a millisecond: `PEXPIRE 0` would delete without a
        // release message.
        let ms = millis(remaining).max(1);
        let mut call = scripts::evalsha(&scripts::KEEP_FOR, 1);
        call.arg(&names.lock).arg(&lease.token).arg(ms);
        let kept: i64 = self.eval(&scripts::KEEP_FOR, &call).await?;
        Ok(Some(kept == 1))
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::all(self)
    }

    /// A single server takes a `MultiLock`'s keys in one script; a Cluster
    /// cannot (the keys of different locks live in different slots).
    fn all_keys(&self) -> Option<&dyn AllKeysBackend> {
        matches!(self.conn, Conn::Single(_)).then_some(self as &dyn AllKeysBackend)
    }

    fn client_name(&self) -> Option<&str> {
        Some(self.own_client_name())
    }

    async fn inspect(&self, key: &str) -> Result<Option<crate::LockInfo>, LockError> {
        self.inspect_lock(key, true).await
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        self.force_release_lock(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, crate::LockInfo)>, LockError> {
        let answer = self.list_locks(prefix).await;
        answer.map_err(|e| self.name_list_refusal(e, prefix))
    }
}

impl RedisBackend {
    /// A lock's compare-and-`DEL` (batched under load) and its `PUBLISH`.
    async fn release_lock(&self, lease: &Lease) -> Result<bool, LockError> {
        let names = KeyNames::new(&self.options.prefix, &lease.key).in_db(self.db);
        let batchers = self.batchers.as_ref().map(LaneBatchers::here);
        let turn = batchers.as_ref().map(|b| {
            b.release.enter(|| ReleaseOp {
                lock: names.lock.clone(),
                token: lease.token.clone(),
                channel: names.channel.clone(),
            })
        });
        let released: i64 = match turn {
            Some(Turn::Queued(answer)) => self.batched(answer).await?,
            _alone => {
                let mut call = scripts::evalsha(&RELEASE, 1);
                call.arg(&names.lock).arg(&lease.token).arg(&names.channel);
                self.eval(&RELEASE, &call).await?
            }
        };
        Ok(released == 1)
    }
}
