//! Redisson's lock layout on Redis (`?layout=redisson` on any Redis URL):
//! a dlock lock is Redisson's `RLock` (and `RFencedLock`) of the same
//! name, so Java services with Redisson, Node services with node-redisson
//! and dlock exclude one another and wake one another's waiters.
//!
//! Matched against Redisson 4.7.0 (`RedissonLock`, `RedissonBaseLock`,
//! `LockPubSub`, `RedissonFencedLock`, `renewal/LockTask`) and node-redisson
//! 1.0.4. The layout (see `names.rs` and `scripts.rs`):
//! - the lock `order:42` is the hash `order:42` (the name as given, no
//!   prefix): one field per holder, `<client id>:<thread id>` for Redisson,
//!   `<client id>:<owner token>` for dlock, the reentrant count as value;
//!   the key's expiry is the lease;
//! - renewal extends the expiry only while the holder's field is there
//!   (Redisson's watchdog), every ttl/3 as dlock's watchdog does;
//! - release decrements the count and, at zero, deletes the hash and
//!   publishes `0` on `redisson_lock__channel:{<name>}` (and on
//!   node-redisson's channel where its name differs; with `SPUBLISH` too on
//!   a Cluster that has sharded pub/sub, which Java Redisson listens to
//!   there);
//! - waiters subscribe to those channels before they try (on such a
//!   Cluster with `SSUBSCRIBE` as well, on a connection of their own, see
//!   `sharded.rs`), and try again on a message, at the holder's `PTTL`, or
//!   at the latest every `recheck_ms` (a release nobody announced: a `DEL`);
//! - fencing: `RFencedLock`'s counter `redisson_lock_token:{<name>}`,
//!   incremented at each grant (it never expires, as Redisson's);
//! - count-down latches are Redisson's `RCountDownLatch` (`latch.rs`).

mod abandoned;
mod inspect;
mod latch;
mod names;
mod scripts;
mod sharded;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::Script;

use self::abandoned::ReleaseIfDropped;
use self::names::{holder_field, RedissonNames};
use self::sharded::{Sharded, ShardedWait};
use crate::backend::{lease_deadline, AcquireRequest, Capabilities, Lease, LockBackend, Renewal};
use crate::backends::redis::config::without_layout;
use crate::backends::redis::kinds::mix;
use crate::backends::redis::protocol::scripts::{evalsha, millis};
use crate::backends::redis::waiting::subscriber::waiting::nap_until;
use crate::backends::redis::{check_ttl, holder_left, jitter, Conn, RedisBackend};
use crate::LockError;

/// Locks in Redisson's layout on one Redis server, a Redis Cluster or a
/// Sentinel deployment's master: `dlock::connect` builds it for a Redis URL
/// with `?layout=redisson`.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// let redis = dlock::connect("redis://127.0.0.1:6379?layout=redisson").await?;
/// // Java: redisson.getLock("order:42").lock() waits while this is held.
/// let guard = dlock::Lock::new("order:42").with_backend(redis).acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct RedissonBackend {
    redis: RedisBackend,
    /// This client's id, the first half of each holder field (Redisson's
    /// per-client UUID).
    client_id: String,
    /// A Cluster whose nodes take `SPUBLISH`: releases announce there too,
    /// where Java Redisson (`shardedSubscriptionMode` AUTO) listens.
    sharded: bool,
    /// On such a Cluster, where waiters hear Java Redisson's `SPUBLISH`
    /// (`None` elsewhere, or when it could not connect: waiters re-check).
    listener: Option<Sharded>,
}

impl std::fmt::Debug for RedissonBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedissonBackend")
            .field("url", &self.redis.options.shown)
            .finish_non_exhaustive()
    }
}

impl RedissonBackend {
    /// Connects to the Redis server, Cluster or Sentinel master named by
    /// `url` (every form and parameter of
    /// [`RedisBackend::connect`](crate::backends::redis::RedisBackend::connect), but
    /// `?prefix=`, `?fence_retention=`, `?foreign_share=`, `?replicas=`,
    /// `?replica_timeout=` and `?aof=`;
    /// `?layout=redisson` may be given or left out).
    ///
    /// # Errors
    /// As [`RedisBackend::connect`](crate::backends::redis::RedisBackend::connect), and
    /// [`LockError::InvalidOption`] for a parameter this layout cannot honour.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let redis = RedisBackend::connect(&without_layout(url)?).await?;
        let client_id = names::client_id();
        let sharded = match &redis.conn {
            Conn::Cluster(_) => redis.takes_sharded_publish().await,
            Conn::Single(_) => false,
        };
        let listener = if sharded {
            let connected = Sharded::connect(&redis.options).await;
            connected
                .map_err(|e| tracing::warn!(backend = %redis.options.shown, error = %e,
                    "no sharded pub/sub connection: waiters hear Java Redisson's releases on this Cluster by re-checking"))
                .ok()
        } else {
            None
        };
        Ok(RedissonBackend {
            redis,
            client_id,
            sharded,
            listener,
        })
    }

    fn names(&self, key: &str) -> RedissonNames {
        RedissonNames::new(key, self.redis.options.cluster)
    }

    fn field(&self, token: &str) -> String {
        holder_field(&self.client_id, token)
    }

    /// One try: the lease, or how long the holder has left.
    async fn attempt(
        &self,
        req: &AcquireRequest,
        names: &RedissonNames,
    ) -> Result<Result<Lease, Option<Duration>>, LockError> {
        let sent = Instant::now();
        let mut call = evalsha(&scripts::ACQUIRE, if names.same_slot { 2 } else { 1 });
        call.arg(&names.lock);
        if names.same_slot {
            call.arg(&names.fence);
        }
        call.arg(millis(req.ttl))
            .arg(self.field(&req.token))
            .arg(if names.dlock_in_script {
                &*names.dlock
            } else {
                ""
            });
        let (won, value): (i64, i64) = self.redis.eval(&scripts::ACQUIRE, &call).await?;
        if won != 1 {
            return Ok(Err(holder_left(value)));
        }
        let fence = if names.same_slot {
            value
        } else {
            // A Cluster name whose counter lives in another slot: counted
            // after the grant, before the lease is handed over, so the next
            // holder's count still comes later.
            let mut incr = redis::cmd("INCR");
            incr.arg(&names.fence);
            self.redis.query(&incr).await?
        };
        if !names.dlock_in_script && self.dlock_layout_holds(names).await? {
            let call = self.release_call(names, &req.token, req.ttl);
            let _ = self.eval_i64(&scripts::RELEASE, &call).await;
            return Err(mix::mixed_layouts(&req.key, &names.dlock, "dlock"));
        }
        Ok(Ok(Lease {
            key: req.key.clone(),
            token: req.token.clone(),
            ttl: req.ttl,
            fencing_token: u64::try_from(fence).ok(),
            valid_until: lease_deadline(sent, req.ttl),
            resource: names.lock.clone(),
        }))
    }

    /// Whether dlock's own layout holds the name, read after a grant where
    /// the acquire's script could not (see `layouts.rs`).
    async fn dlock_layout_holds(&self, names: &RedissonNames) -> Result<bool, LockError> {
        let mut exists = redis::cmd("EXISTS");
        exists.arg(&names.dlock);
        Ok(self.redis.query::<i64>(&exists).await? == 1)
    }

    /// [`attempt`](Self::attempt), giving back what it may have taken if
    /// it is dropped or fails with the script in flight.
    async fn attempt_or_release(
        &self,
        req: &AcquireRequest,
        names: &RedissonNames,
    ) -> Result<Result<Lease, Option<Duration>>, LockError> {
        // A server reached by a new connection is read again first (see
        // `eviction.rs`).
        self.redis.eviction_unchanged().await?;
        let call = self.release_call(names, &req.token, req.ttl);
        let mut unfinished = ReleaseIfDropped::arm(&self.redis.conn, call);
        let answer = self.attempt(req, names).await?;
        unfinished.disarm();
        Ok(answer)
    }

    /// The release of `token`'s hold on `names`, as a script call.
    fn release_call(&self, names: &RedissonNames, token: &str, ttl: Duration) -> redis::Cmd {
        let spublish = self.sharded && names.same_slot;
        let mut call = evalsha(&scripts::RELEASE, if spublish { 2 } else { 1 });
        call.arg(&names.lock);
        if spublish {
            call.arg(&names.channel);
        }
        call.arg(self.field(token))
            .arg(millis(ttl))
            .arg(if spublish { "1" } else { "0" })
            .arg(names.channels());
        call
    }

    async fn eval_i64(&self, script: &Script, call: &redis::Cmd) -> Result<i64, LockError> {
        self.redis.eval(script, call).await
    }

    /// Waits for the lock: subscribed first, then a try; after each failed
    /// try, a nap until a message on the lock's channels, the holder's
    /// `PTTL`, the re-check cap or the deadline.
    async fn wait_for(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let names = self.names(&req.key);
        let mut subscription = self
            .redis
            .subscriber
            .subscribe(&names.channels(), deadline)
            .await;
        let mut sharded = match &self.listener {
            Some(listener) if names.same_slot => Some(listener.subscribe(&names.channel).await),
            _ => None,
        };
        let recheck = self.redis.options.recheck.unwrap_or(Duration::MAX);
        loop {
            subscription.mark_seen();
            if let Some(sharded) = sharded.as_mut() {
                sharded.mark_seen();
            }
            let tried = self.attempt_or_release(req, &names);
            let answer = match crate::backend::deadline::until(deadline, tried).await {
                Some(answer) => answer?,
                None => return Ok(None),
            };
            let left = match answer {
                Ok(lease) => return Ok(Some(lease)),
                Err(left) => left,
            };
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
            let nap = left.unwrap_or(recheck).min(recheck) + jitter(Duration::from_millis(5));
            tokio::select! {
                () = subscription.changed() => {}
                () = sharded_changed(sharded.as_mut()) => {}
                () = nap_until(nap, deadline) => {}
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
        }
    }
}

/// Resolves at a message on the sharded subscription; never without one.
async fn sharded_changed(wait: Option<&mut ShardedWait>) {
    match wait {
        Some(wait) => wait.changed().await,
        None => std::future::pending().await,
    }
}

impl RedisBackend {
    /// Whether the server takes sharded pub/sub (Redis 7+), asked as
    /// Redisson asks it: `PUBSUB SHARDNUMSUB`.
    async fn takes_sharded_publish(&self) -> bool {
        let mut cmd = redis::cmd("PUBSUB");
        cmd.arg("SHARDNUMSUB");
        self.query::<redis::Value>(&cmd).await.is_ok()
    }
}

#[async_trait]
impl LockBackend for RedissonBackend {
    fn describe(&self) -> String {
        self.redis.options.shown.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.key, &self.redis.options.shown)?;
        let names = self.names(&req.key);
        Ok(self.attempt_or_release(req, &names).await?.ok())
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.key, &self.redis.options.shown)?;
        self.wait_for(req, deadline).await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        // Sent together: on a multiplexed connection they share the wire.
        let renewals = leases.iter().map(|lease| async move {
            let sent = Instant::now();
            let mut call = evalsha(&scripts::RENEW, 1);
            call.arg(&lease.resource)
                .arg(millis(lease.ttl))
                .arg(self.field(&lease.token));
            Ok(match self.eval_i64(&scripts::RENEW, &call).await? {
                1 => Renewal::Renewed {
                    valid_until: lease_deadline(sent, lease.ttl),
                },
                0 => Renewal::Deleted,
                _ => Renewal::Refused,
            })
        });
        futures_util::future::join_all(renewals).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let names = self.names(&lease.key);
        let call = self.release_call(&names, &lease.token, lease.ttl);
        Ok(self.eval_i64(&scripts::RELEASE, &call).await? == 1)
    }

    fn client_name(&self) -> Option<&str> {
        Some(self.redis.own_client_name())
    }

    /// Count-down latches only (Redisson's `RCountDownLatch`, `latch.rs`).
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            latch: Some(self),
            ..Capabilities::default()
        }
    }

    async fn inspect(&self, key: &str) -> Result<Option<crate::LockInfo>, LockError> {
        self.inspect_lock(key).await
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let names = self.names(key);
        let spublish = self.sharded && names.same_slot;
        let mut call = evalsha(&scripts::FORCE_RELEASE, if spublish { 2 } else { 1 });
        call.arg(&names.lock);
        if spublish {
            call.arg(&names.channel);
        }
        call.arg(if spublish { "1" } else { "0" })
            .arg(names.channels());
        Ok(self.eval_i64(&scripts::FORCE_RELEASE, &call).await? == 1)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, crate::LockInfo)>, LockError> {
        self.list_locks(prefix).await
    }
}
