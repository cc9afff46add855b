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
use crate::backends::redis::waiting::recheck::keyspace_channel;
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
        let granted = self.unless_redisson_holds(granted).await?;
        self.listen_as_holder(granted.as_ref());
        Ok(granted)
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.key, &self.options.shown)?;
        // Behind Sentinel, through a failover within the wait (`ride_through.rs`).
        let granted = self.riding_failovers(req, deadline).await?;
        let granted = self.unless_redisson_holds(granted).await?;
        self.listen_as_holder(granted.as_ref());
        Ok(granted)
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let renewed = self.renew_locks(leases).await;
        for (lease, answer) in leases.iter().zip(&renewed) {
            if matches!(answer, Ok(r) if !matches!(r, Renewal::Renewed { .. })) {
                self.stop_listening_as_holder(lease);
            }
        }
        self.name_refusals(leases, renewed, About::Lock)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        // Before the `DEL`, so its event does not ring the alarm.
        self.stop_listening_as_holder(lease);
        let answer = self.release_lock(lease).await;
        answer.map_err(|e| self.name_refusal(e, About::Lock(&lease.key)))
    }

    async fn release_after(
        &self,
        lease: &Lease,
        remaining: Duration,
    ) -> Result<Option<bool>, LockError> {
        self.stop_listening_as_holder(lease);
        let names = KeyNames::new(&self.options.prefix, &lease.key);
        // At least a millisecond: `PEXPIRE 0` would delete without a
        // release message.
        let ms = millis(remaining).max(1);
        let mut call = scripts::evalsha(&scripts::KEEP_FOR, 1);
        call.arg(&names.lock).arg(&lease.token).arg(ms);
        let kept: i64 = self.eval(&scripts::KEEP_FOR, &call).await?;
        Ok(Some(kept == 1))
    }

    /// Rung when a held key's keyspace channel says the key was deleted,
    /// expired, evicted or overwritten (see `subscriber/holding.rs`).
    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.subscriber.loss_alarm())
    }

    /// No elections with `?fence=off`: a term is the leader's fence.
    fn capabilities(&self) -> Capabilities<'_> {
        let mut offers = Capabilities {
            latch: Some(self),
            barrier: Some(self),
            ..Capabilities::all(self)
        };
        if !self.options.fenced {
            offers.election = None;
        }
        offers
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
        // With `?fence=off` a counter left by an earlier fenced holder is not
        // this holder's fence: none is shown.
        self.inspect_lock(key, self.options.fenced).await
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
    /// Where the server notifies: listens to the granted lock's keyspace
    /// channel, so its loss rings the alarm (see `subscriber/holding.rs`).
    fn listen_as_holder(&self, granted: Option<&Lease>) {
        let Some(lease) = granted else { return };
        let lock = KeyNames::new(&self.options.prefix, &lease.key).lock;
        if let Some(channel) = self.keyspace_channel(&lock) {
            self.subscriber.hold(channel, &lease.token);
        }
    }

    /// The lease ended here (released, lost): its events no longer matter.
    fn stop_listening_as_holder(&self, lease: &Lease) {
        // Not `keyspace_channel`, which says `None` once the server
        // refused a keyspace channel: what was held is forgotten all the same.
        let Some(db) = self.notifying_db else { return };
        let lock = KeyNames::new(&self.options.prefix, &lease.key).lock;
        self.subscriber
            .unhold(&keyspace_channel(db, &lock), &lease.token);
    }

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
