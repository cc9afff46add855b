//! The Redis backend: one server, a Redis Cluster, or the master of a
//! Sentinel deployment (`redis://`, `rediss://`, `redis+cluster://`,
//! `redis+sentinel://`, `rediss+sentinel://`).
//!
//! Capabilities: ✓ mutual exclusion across processes and machines · ✓ lease
//! expiry · ✓ fencing tokens (a per-key counter that never goes below the
//! server's clock, so it survives losing the counter; see below) · ✓ waiters woken by pub/sub
//! · ✓ batched renewal (one pipeline per tick) · ✓ TLS and ACL users ·
//! ✓ semaphores (a sorted set of permits, see `permits.rs`) ·
//! ✓ read-write locks (see below and `rw.rs`) ·
//! ✓ Sentinel: the master is found through the sentinels and followed across
//! failovers (see `sentinel.rs`) ·
//! ◐ safety across a failover: Redis replicates asynchronously, so a lock
//! written to a primary that dies before replicating it is gone on the new
//! primary. Every grant and renewal therefore waits for replica
//! acknowledgement (`WAIT`, `?replicas=auto|N`, see `replicas.rs`) and an
//! unacknowledged grant is given back; that is not consensus (a replica that
//! had not acknowledged can still be promoted). Where that matters, use etcd
//! or ZooKeeper (or Redlock, with its own limits).
//!
//! Protocol (see [`scripts`](self) in the source):
//! - acquire: one Lua script does `SET <prefix>:{key} <token> NX PX <ttl>`
//!   and issues the next fence from `<prefix>:{key}:fence` (one `SET … GET`
//!   of the counter, and one `TIME` per script run), returning it; when the key is
//!   held it returns the holder's `PTTL` instead; held with the caller's own
//!   token (a resent acquire whose answer was lost), it is acquired again
//!   with the fence issued the first time;
//! - fencing: a fence is never below the server's clock in microseconds
//!   since the epoch (`TIME` in the script; the counter is set to it when it
//!   is behind). So fences keep increasing when the counter is lost — a
//!   restart without persistence, a failover to a replica that missed it, an
//!   `allkeys-*` eviction, a flush — provided the clock of the server that
//!   issues the next fence is not behind the one that issued the last fence
//!   by more than the time between them (slewing clocks never are). Fences
//!   stay below 2^53, exact in JSON, until the year 2255. So the counter
//!   may expire on purpose: it is kept `?fence_retention=` (default one
//!   day; at least the lease's ttl) after its last fence, and a key locked
//!   once leaves nothing on the server after that, under the same clock
//!   assumption;
//! - renew: compare-and-`PEXPIRE`, all due leases in one pipeline;
//! - release: compare-and-`DEL`, then `PUBLISH <prefix>:{key}:released`;
//! - waiting: subscribe to the release channel on the backend's one shared
//!   pub/sub connection, try, then wait for a release message or the
//!   holder's remaining `PTTL` (expiry announces nothing), with jitter;
//! - a release that announces nothing (a client that is not dlock, `DEL`,
//!   `FLUSHALL`): the waiter also listens to the key's keyspace channel when
//!   the server has keyspace notifications on (read at connect, never
//!   changed), and re-checks the key with a `PTTL`, backing off from 5 ms
//!   to a cap (see `recheck.rs` in the source);
//! - under load (more than a few acquires or releases in flight at once on
//!   a single server), queued requests go out together as one script call
//!   that runs the same steps for each key, to spare the server the fixed
//!   cost of a script per key (see `batching.rs` in the source).
//!
//! Read-write locks (`RwLock`; see `rw.rs` in the source for the table of
//! keys): every key of one read-write lock shares the hash tag `{key}`, so
//! each attempt is one script, also on a Cluster, apart from the plain
//! lock of the same key:
//! - readers: a sorted set `<prefix>:{key}:rw:readers`, token → expiry in
//!   ms on the server's clock (`TIME`), so each reader expires on its own;
//!   every script first drops the expired ones; the set expires with its
//!   latest reader;
//! - the writer: `<prefix>:{key}:rw:writer` holding its token, `PX` ttl;
//! - writers do not starve: a writer that must wait puts a mark in
//!   `<prefix>:{key}:rw:waiting` (token → mark expiry) and its arrival in
//!   `<prefix>:{key}:rw:order` (token → `TIME` in µs); a reader gets in only
//!   while no mark is live, and a writer only when it is the oldest live
//!   mark (or none waits) and no reader is live. A waiting writer tries
//!   again at least every third of its mark's lifetime (its ttl, within
//!   0.3 s and 3 s), which refreshes the mark; one that gives up or is
//!   dropped removes it at once (announced), one that crashes leaves it to
//!   expire within that lifetime;
//! - fencing: a write takes the next fence of `<prefix>:{key}:rw:fence` as
//!   a lock does (`max(last + 1, now µs)`); a read's fence is the counter's
//!   value, the last write's fence, or the clock in µs when the counter is
//!   missing (then stored, so the next write is above it): at least every
//!   write before it, below every write after it, across a restart
//!   without persistence under the same clock assumption as a lock's;
//! - renew: a reader's score is extended while it is live (the permit
//!   renewal script), a writer's key by compare-and-`PEXPIRE` (or
//!   `SET … IFEQ`), in the same pipelines as locks; release: `ZREM` (which
//!   announces once no reader is left) or compare-and-`DEL` of the writer
//!   (always announced), on `<prefix>:{key}:rw:released`;
//! - waiting: as a lock's, on that channel, with a timer at the expiry of
//!   the lease or mark in the way (the script says which) and a re-check of
//!   that key for an operator's `DEL`. A dropped acquisition removes what
//!   its token may hold or have marked, in the background. Nothing but the
//!   fence counter is left after the last release, and it expires
//!   `?fence_retention=` after the last write.
//!
//! A ttl above [`MAX_TTL`] (365 days; `Duration::MAX` for
//! "forever") is refused with [`LockError::InvalidOption`] naming the maximum.
//!
//! Sentinel: `redis+sentinel://[user:password@]h1:p1,h2:p2/<master>[?db=N&sentinel_user=..&sentinel_password=..&replica_gone_after=..]`.
//! Replica acknowledgement on every form: `?replicas=auto|N` (default
//! `auto`: every replica, behind Sentinel also one away; 0: off) and `?replica_timeout=250ms`
//! (default a tenth of the ttl, within 10 ms and 1 s); a grant too few
//! replicas acknowledge is [`LockError::Replication`].
//!
//! URL parameters: `?prefix=name` (key namespace, default `dlock`),
//! `?timeout_ms=N` (one request's time limit, default 5000),
//! `?recheck_ms=N` (the cap of a waiter's re-checks, default 1000; `0`
//! turns them off), `?fence_retention=1d` (how long a key's fence counter
//! is kept after its last fence, default one day, at most 365 days), and for
//! `rediss://` with the `tls` feature, `?ca=/path/ca.pem` (trust this CA).

mod all_keys;
mod batching;
mod compare_set;
mod config;
mod connection;
mod election;
#[cfg(feature = "redlock")]
mod for_redlock;
mod inspect;
mod permits;
pub(crate) mod recheck;
mod refused;
pub use self::refused::{ACL_COMMANDS, ACL_LIST_COMMANDS};
mod renew;
mod renew_many;
mod replicas;
mod ride_through;
mod rw;
pub(crate) mod scripts;
mod sentinel;
pub(crate) mod subscriber;
mod turns;
mod unfinished;
mod waiter_queue;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, RedisResult, Script};

use self::batching::ops::{AcquireOp, Acquires, ReleaseOp, Releases};
use self::batching::{Batcher, Turn};
use self::config::{client, tls_cluster, RedisOptions};
use self::connection::{Connection, Server};
#[cfg(feature = "redlock")]
pub(crate) use self::for_redlock::nap_until;
use self::recheck::{keyspace_channel, notifies_releases, Recheck};
use self::refused::About;
use self::replicas::ReplicaAck;
use self::scripts::{millis, KeyNames, ACQUIRE, ACQUIRE_MANY, RELEASE, RELEASE_MANY};
use self::sentinel::Sentinel;
use self::subscriber::{Source, Subscriber};
use self::turns::Beats;
use self::unfinished::ReleaseIfDropped;
use crate::backend::{
    lease_deadline, AcquireRequest, AllKeysBackend, Capabilities, Lease, LockBackend, Renewal,
};
use crate::LockError;

#[cfg(feature = "redlock")]
pub(crate) use self::config::REDIS_PORT;
/// The longest ttl: dlock's own [`MAX_TTL`], checked here
/// too for callers of the backend trait itself. Below it everything the
/// scripts compute from a ttl stays exact: `PX` (Redis takes up to 2^63 ms
/// minus the current time) and the permit scripts' expiry scores (Lua
/// numbers, exact below 2^53 ms).
pub(crate) use crate::lease::ttl::MAX_TTL;

/// Refuses a ttl above [`MAX_TTL`] for `what` (a lock key or a semaphore
/// name) on `backend`.
pub(crate) fn check_ttl(ttl: Duration, what: &str, backend: &str) -> Result<(), LockError> {
    if ttl <= MAX_TTL {
        return Ok(());
    }
    Err(LockError::invalid_option(format!(
        "ttl {ttl:?} for `{what}` on `{backend}` is longer than the maximum of {MAX_TTL:?} (365 days, dlock::MAX_TTL); \
         give a shorter ttl: the lease is renewed for as long as the guard lives"
    )))
}

/// Locks on one Redis server or one Redis Cluster.
///
/// Connections are shared: one multiplexed connection (reconnecting) carries
/// every request of every task, and one pub/sub connection carries every
/// waiter's notifications.
///
/// ```no_run
/// use dlock::backends::redis::RedisBackend;
/// use std::sync::Arc;
///
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// let redis = Arc::new(RedisBackend::connect("redis://127.0.0.1:6379").await?);
/// dlock::registry().set_default(redis);
/// let guard = dlock::Lock::new("order:42").acquire().await?;
/// // redis-cli GET 'dlock:{order:42}' shows guard.token()
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct RedisBackend {
    conn: Conn,
    /// Request batching under load (see `batch.rs`); single servers only.
    batchers: Option<Batchers>,
    subscriber: Subscriber,
    /// The heartbeat of this backend's queued waiters (see `turns.rs`).
    beats: Beats,
    /// Replica acknowledgement of grants and renewals (`?replicas=`).
    replicas: Arc<ReplicaAck>,
    options: RedisOptions,
    /// The database whose keyspace notifications wake waiters: `Some` when
    /// the server publishes generic and expired events on keyspace
    /// channels (read at connect; see `recheck.rs`).
    notifying_db: Option<i64>,
    /// The database the keys live in; its release channels are its own
    /// (see `scripts::db_channel`).
    db: i64,
    /// Whether the server takes `SET … IFEQ` (Valkey 8.1+, Redis 8.4+; see
    /// `compare_set.rs`): lock renewals then use it instead of a script.
    /// Probed at connect; cleared for good when a server refuses it later
    /// (a failover or a downgrade to one without it; see `renew.rs`).
    set_ifeq: AtomicBool,
    metrics: Counters,
}

/// The backend's one connection. Both kinds run on dlock's background
/// runtime, whatever runtime connected (see `connection.rs`): a single
/// server's through [`Connection`], a cluster's because it is created
/// there, and its driver, which alone (re)connects to the nodes, stays
/// there.
#[derive(Clone)]
enum Conn {
    /// One server, or the master of a Sentinel deployment.
    Single(Server),
    Cluster(ClusterConnection),
}

struct Batchers {
    acquire: Batcher<Acquires>,
    release: Batcher<Releases>,
}

#[derive(Debug, Default)]
struct Counters {
    round_trips: AtomicU64,
    renew_round_trips: AtomicU64,
    rechecks: AtomicU64,
}

/// Request counts of one [`RedisBackend`], for monitoring and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisMetrics {
    /// Requests sent (a pipeline or a batch counts once).
    pub round_trips: u64,
    /// Batched script calls among them: acquire attempts or releases of
    /// many keys sent together because the connection was busy.
    pub batches: u64,
    /// Renewal round trips: with batching, about one per renewal tick
    /// however many leases are live.
    pub renew_round_trips: u64,
    /// Re-checks among them: one `PTTL` of a held key by its waiter, which
    /// notices a release that published nothing (see Redis in
    /// [`crate::guide::backends`]): at most one per waiting key per
    /// `recheck_ms`.
    pub rechecks: u64,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.options.shown)
            .field("prefix", &self.options.prefix)
            .finish_non_exhaustive()
    }
}

/// What an acquire script answered (a lock's, or a semaphore's).
pub(crate) enum Attempt {
    Acquired(Lease),
    /// Held by another owner (all permits held) for this much longer
    /// (`None`: unknown).
    Held(Option<Duration>),
    /// A queued waiter's try (see `waiter_queue.rs`): held, or about to be
    /// taken, with another live waiter ahead in the queue: sleep this long
    /// unless woken, and leave the re-checks to the head.
    Behind(Option<Duration>),
}

impl RedisBackend {
    /// Connects to the server or cluster named by `url`.
    ///
    /// Forms: `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS, needs
    /// the `tls` feature; `?ca=/path/ca.pem` to trust a private CA),
    /// `redis+cluster://[user:pass@]host:port,host:port,…`,
    /// `redis+sentinel://[user:pass@]host:port,host:port/<master>[?db=N&sentinel_user=..&sentinel_password=..]`
    /// (and `rediss+sentinel://`). Every form takes `?replicas=auto|N` and
    /// `?replica_timeout=` (replica acknowledgement of grants and renewals).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a malformed URL, naming it with the
    /// password redacted; [`LockError::Backend`] if the server cannot be
    /// reached or refuses the credentials.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let options = RedisOptions::parse(url)?;
        let fail = |e: RedisError| LockError::backend(options.shown.clone(), e);
        let first = client(&options, &options.nodes[0])?;
        let mut db = first.get_connection_info().redis_settings().db();
        let replicas = Arc::new(ReplicaAck::new(
            options.replicas,
            options.replica_timeout,
            options.aof,
        ));
        let mut source = Source::Fixed(Box::new(first.clone()));
        let conn = if let Some(target) = &options.sentinel {
            // A failover moves the master: its replica counts are another's.
            let on_switch = {
                let replicas = replicas.clone();
                Box::new(move || replicas.forget())
            };
            let sentinel =
                Sentinel::connect(&options, target, connection_config(&options), on_switch).await?;
            db = target.db;
            source = Source::Master(sentinel.clone());
            Conn::Single(Server::Followed(sentinel))
        } else if options.cluster {
            let mut builder = redis::cluster::ClusterClientBuilder::new(options.nodes.clone())
                .connection_timeout(Duration::from_secs(2))
                .response_timeout(options.response_timeout);
            if options.tls {
                builder = tls_cluster(builder, &options)?;
            }
            let cluster = builder.build().map_err(fail)?;
            // Created on the background runtime: the cluster connection
            // spawns its driver where it is created.
            let connected =
                crate::lease::background::run(async move { cluster.get_async_connection().await });
            Conn::Cluster(connected.await.map_err(fail)?)
        } else {
            Conn::Single(Server::One(
                Connection::open(first.clone(), connection_config(&options))
                    .await
                    .map_err(fail)?,
            ))
        };
        let batchers = match &conn {
            Conn::Single(c) => Some(Batchers {
                acquire: Batcher::new(c.clone()),
                release: Batcher::new(c.clone()),
            }),
            Conn::Cluster(_) => None,
        };
        let mut backend = RedisBackend {
            conn,
            batchers,
            // In a cluster a PUBLISH reaches every node, so one subscriber
            // connection to any node hears every release.
            subscriber: Subscriber::new(source, &options.prefix),
            beats: Beats::default(),
            replicas,
            options,
            notifying_db: None,
            db,
            set_ifeq: AtomicBool::new(false),
            metrics: Counters::default(),
        };
        // Prove the connection and credentials now, not at the first lock;
        // the setting and the server's commands are read in the same round
        // trip.
        let (loaded, notifying, set_ifeq) = tokio::join!(
            backend.load_scripts(),
            backend.read_notifications(),
            backend.probe_set_ifeq()
        );
        loaded.map_err(|e| backend.name_connect_refusal(e))?;
        backend.notifying_db = notifying.then_some(db);
        *backend.set_ifeq.get_mut() = set_ifeq;
        Ok(backend)
    }

    /// The address (`host:port`) of the master this backend writes to: for
    /// a `redis+sentinel://` URL, the one the sentinels named last (it
    /// changes with a failover); `None` for one server or a Cluster.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let redis = dlock::backends::redis::RedisBackend::connect(
    ///     "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster",
    /// )
    /// .await?;
    /// println!("writing to {:?}", redis.sentinel_master());
    /// # Ok(()) }
    /// ```
    pub fn sentinel_master(&self) -> Option<String> {
        match &self.conn {
            Conn::Single(Server::Followed(sentinel)) => Some(sentinel.master_addr()),
            _ => None,
        }
    }

    /// Request counts so far.
    pub fn metrics(&self) -> RedisMetrics {
        let batches = self
            .batchers
            .as_ref()
            .map_or(0, |b| b.acquire.batches() + b.release.batches());
        RedisMetrics {
            round_trips: self.metrics.round_trips.load(Ordering::Relaxed) + batches,
            batches,
            renew_round_trips: self.metrics.renew_round_trips.load(Ordering::Relaxed),
            rechecks: self.metrics.rechecks.load(Ordering::Relaxed),
        }
    }

    /// Whether waiters listen to the server's keyspace notifications, which
    /// wake them on a release nobody announced: the server publishes generic
    /// and expired events on keyspace channels (`notify-keyspace-events`
    /// with `K`, `g` and `x`, or `K` and `A`, as read at connect) and has
    /// not refused this user those channels (ACL). Always `false` on a Redis
    /// Cluster, whose nodes each publish only their own keys' events: there
    /// waiters re-check instead.
    pub fn keyspace_notifications(&self) -> bool {
        self.notifying_db.is_some()
            && !self.subscriber.keyspace_refused()
            && !self.subscriber.release_refused()
    }

    /// Whether the server refused dlock's release channels to this user
    /// (an ACL that allows no `&dlock:*` channel): waiters then wake at the
    /// holder's expiry or by re-checking the key, not at a release. Known
    /// once a waiter has tried to subscribe; logged once as a warning.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let redis = dlock::backends::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// if redis.release_channels_refused() {
    ///     eprintln!("allow dlock's channels: ACL SETUSER <user> &dlock:*");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn release_channels_refused(&self) -> bool {
        self.subscriber.release_refused()
    }

    /// Reads `notify-keyspace-events` (single servers only: see
    /// [`keyspace_notifications`](Self::keyspace_notifications)). dlock
    /// never changes it. A server that refuses `CONFIG` (an ACL without it,
    /// a managed Redis that renames it) counts as not notifying: its
    /// waiters re-check.
    async fn read_notifications(&self) -> bool {
        let Conn::Single(mut conn) = self.conn.clone() else {
            return false;
        };
        self.count();
        let answer: RedisResult<std::collections::HashMap<String, String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("notify-keyspace-events")
            .query_async(&mut conn)
            .await;
        match answer {
            Ok(config) => config
                .get("notify-keyspace-events")
                .is_some_and(|flags| notifies_releases(flags)),
            Err(e) => {
                tracing::debug!(backend = %self.options.shown, error = %e,
                    "cannot read notify-keyspace-events; waiters re-check instead");
                false
            }
        }
    }

    /// Whether lock renewals use `SET … IFEQ … PX` (one plain command)
    /// instead of the compare-and-`PEXPIRE` script: the server took the
    /// command when probed at connect (Valkey 8.1 and later, Redis 8.4 and
    /// later), and no server has refused it since. Same effect either way;
    /// the command spares the server a script call per renewal.
    ///
    /// A server that answers it with a syntax error later (a failover or a
    /// rolling downgrade to a version without it; on a Cluster, a node that
    /// lacks it) turns this off for good: that renewal, and every one
    /// after it, runs the script instead, which every server takes.
    pub fn renews_without_scripts(&self) -> bool {
        self.set_ifeq.load(Ordering::Relaxed)
    }

    async fn probe_set_ifeq(&self) -> bool {
        self.count();
        let prefix = &self.options.prefix;
        match self.conn.clone() {
            Conn::Single(mut c) => compare_set::probe(&mut c, prefix).await,
            Conn::Cluster(mut c) => compare_set::probe(&mut c, prefix).await,
        }
    }

    /// The keyspace channel of the lock key `lock` if the server notifies
    /// (see [`keyspace_notifications`](Self::keyspace_notifications)).
    pub(crate) fn keyspace_channel(&self, lock: &str) -> Option<String> {
        self.notifying_db
            .filter(|_| self.keyspace_notifications())
            .map(|db| keyspace_channel(db, lock))
    }

    /// A waiter's re-check schedule on this server (`None`: off).
    fn recheck(&self) -> Option<Recheck> {
        Recheck::new(self.options.recheck, self.keyspace_notifications())
    }

    /// One re-check: whether the key `lock` is gone (`PTTL` = -2). Queued
    /// waiters do not re-check: their heartbeat tries are their checks
    /// (see `waiter_queue.rs`).
    pub(crate) async fn key_is_free(&self, lock: &str) -> Result<bool, LockError> {
        self.metrics.rechecks.fetch_add(1, Ordering::Relaxed);
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(lock);
        let pttl: i64 = self.query(&cmd).await?;
        Ok(pttl == -2)
    }

    /// Sends one plain command, on whichever connection this backend has.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, LockError> {
        self.count();
        let answer = match self.conn.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        };
        answer.map_err(|e| self.error(e))
    }

    fn error(&self, e: RedisError) -> LockError {
        LockError::backend(self.options.shown.clone(), e)
    }

    /// The answer of a request that went out in a batch.
    async fn batched<T>(
        &self,
        answer: tokio::sync::oneshot::Receiver<Result<T, String>>,
    ) -> Result<T, LockError> {
        match answer.await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(message)) => Err(LockError::backend(self.options.shown.clone(), message)),
            Err(_) => Err(LockError::backend(
                self.options.shown.clone(),
                "the batch was dropped unsent (is the runtime shutting down?)",
            )),
        }
    }

    fn count(&self) {
        self.metrics.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// Loads the acquire, renew and release scripts (and their batched
    /// forms) into a single server's cache, all in one round trip, which
    /// also proves the connection and the credentials; a cluster is pinged
    /// instead (its scripts load on each node at first use).
    ///
    /// Why at connect: the first use of a script not in the cache costs three
    /// round trips (`EVALSHA`, `NOSCRIPT`, load, again). Redlock's per-node
    /// timeouts are short against that, and a local waiter's acquire sent
    /// right behind a first release would overtake the release's retry.
    async fn load_scripts(&self) -> Result<(), LockError> {
        let Conn::Single(conn) = &self.conn else {
            return self.ping().await;
        };
        self.count();
        // Polled together, the loads go out in one write.
        let loads = [
            &*ACQUIRE,
            &*renew_many::RENEW_KEYS,
            &*RELEASE,
            &*ACQUIRE_MANY,
            &*RELEASE_MANY,
            &*scripts::ACQUIRE_ALL,
        ]
        .map(|script| {
            let mut conn = conn.clone();
            async move { script.load_async(&mut conn).await }
        });
        futures_util::future::try_join_all(loads)
            .await
            .map(drop)
            .map_err(|e| self.error(e))
    }

    async fn ping(&self) -> Result<(), LockError> {
        self.count();
        let mut cmd = redis::cmd("PING");
        let answer: RedisResult<String> = match self.conn.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.arg("dlock").query_async(&mut c).await,
        };
        answer.map(drop).map_err(|e| self.error(e))
    }

    /// Runs a script call built by [`scripts::evalsha`].
    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        call: &redis::Cmd,
    ) -> Result<T, LockError> {
        self.count();
        let answer = match self.conn.clone() {
            Conn::Single(mut c) => scripts::run(&mut c, script, call).await,
            Conn::Cluster(mut c) => scripts::run(&mut c, script, call).await,
        };
        answer.map_err(|e| self.error(e))
    }

    /// Bounds one request by the caller's deadline: when the wait runs out
    /// with the request in flight, the answer is `ran_out` (a "held" that
    /// ends the wait, so the caller gets `Timeout`), not an error. The
    /// server did not fail; the caller's time ended. The request is
    /// dropped, and what it may have taken is given back by its own
    /// release-if-dropped guard (`unfinished.rs`). An outage still shows:
    /// a request that fails before the deadline is `Backend`.
    async fn within<T>(
        &self,
        deadline: Option<Instant>,
        request: impl std::future::Future<Output = Result<T, LockError>>,
        ran_out: T,
    ) -> Result<T, LockError> {
        match crate::backend::deadline::until(deadline, request).await {
            Some(answer) => answer,
            None => Ok(ran_out),
        }
    }

    /// One run of the acquire script, alone or in a batch. With
    /// `release_unclaimed`, a lease taken in a batch whose caller went away
    /// meanwhile is released at once (see `batched.rs` for why Redlock
    /// declines).
    pub(crate) async fn attempt(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
        release_unclaimed: bool,
    ) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        let turn = self.batchers.as_ref().map(|b| {
            b.acquire.enter(|| AcquireOp {
                lock: names.lock.clone(),
                fence: names.fence.clone(),
                token: req.token.clone(),
                ttl_ms: millis(req.ttl),
                retention_ms: self.fence_retention_ms(),
                release_unclaimed: release_unclaimed.then(|| names.channel.clone()),
            })
        });
        let (won, value): (i64, i64) = match turn {
            Some(Turn::Queued(answer)) => self.batched(answer).await?,
            _alone => {
                let mut call = scripts::evalsha(&ACQUIRE, 2);
                call.arg(&names.lock)
                    .arg(&names.fence)
                    .arg(&req.token)
                    .arg(millis(req.ttl))
                    .arg(self.fence_retention_ms());
                self.eval(&ACQUIRE, &call).await?
            }
        };
        self.attempt_answer(req, names, sent, won, value)
    }

    /// The last argument of every script that issues fences: how long a
    /// fencing counter outlives its last fence, in ms (`?fence_retention=`).
    pub(crate) fn fence_retention_ms(&self) -> u64 {
        millis(self.options.fence_retention)
    }

    /// Reads the acquire scripts' answer: `{1, fence}` or `{0, pttl}`.
    fn attempt_answer(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
        sent: Instant,
        won: i64,
        value: i64,
    ) -> Result<Attempt, LockError> {
        if won == 1 {
            let fence = u64::try_from(value).map_err(|_| {
                self.error(RedisError::from((
                    redis::ErrorKind::Parse,
                    "fence counter is negative",
                    names.fence.clone(),
                )))
            })?;
            return Ok(Attempt::Acquired(granted(req, names, sent, fence)));
        }
        Ok(Attempt::Held(holder_left(value)))
    }

    /// The compare-and-delete of `lease`, sent by this future itself and
    /// never queued in a release batch: on the connection at its first
    /// poll (unless the connection is being re-established), and never sent
    /// once the future is dropped. Redlock undoes a failed round with it,
    /// so that the undo is not held back behind other keys' releases while
    /// the next round's acquire of the same token goes out ahead of it.
    pub(crate) async fn release_unbatched(&self, lease: &Lease) -> Result<bool, LockError> {
        let names = KeyNames::new(&self.options.prefix, &lease.key).in_db(self.db);
        let mut call = scripts::evalsha(&RELEASE, 1);
        call.arg(&names.lock).arg(&lease.token).arg(&names.channel);
        let released: i64 = self.eval(&RELEASE, &call).await?;
        Ok(released == 1)
    }

    /// A guard that releases the lock `names` for `token` if dropped
    /// armed: an acquisition that may have been granted and was given up.
    fn release_if_dropped<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
    ) -> ReleaseIfDropped<'a> {
        ReleaseIfDropped::arm(&self.conn, &RELEASE, &names.lock, token, &names.channel)
    }

    /// [`attempt`](Self::attempt) for this backend's own `acquire` and
    /// `try_acquire`: if the future is dropped (or fails) with the script in
    /// flight, the lease it may have taken is released, not left to its ttl.
    ///
    /// Not for Redlock, which retries with the same token after a dropped
    /// attempt: a release queued for the dropped one could delete the retry's
    /// lease. Here a dropped or failed attempt always ends the acquisition.
    async fn attempt_or_release(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
    ) -> Result<Attempt, LockError> {
        let mut unfinished = self.release_if_dropped(names, &req.token);
        let answer = self.attempt(req, names, true).await?;
        unfinished.disarm();
        Ok(answer)
    }
}

/// How the connection to one server (or to a Sentinel deployment's master)
/// connects and retries.
fn connection_config(options: &RedisOptions) -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(options.response_timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// The lease an acquire script (`ACQUIRE`, `ACQUIRE_ALL`) granted `req` on
/// the lock key of `names`, with its fence; sent at `sent`, from which its
/// validity runs.
pub(crate) fn granted(req: &AcquireRequest, names: &KeyNames, sent: Instant, fence: u64) -> Lease {
    Lease {
        key: req.key.clone(),
        token: req.token.clone(),
        ttl: req.ttl,
        fencing_token: Some(fence),
        valid_until: lease_deadline(sent, req.ttl),
        resource: names.lock.clone(),
    }
}

/// A holder's time left from its key's `PTTL`: -2 the key vanished meanwhile
/// (retry now); -1 a key without expiry, set by someone else (unknown: wait
/// for a release).
pub(crate) fn holder_left(pttl: i64) -> Option<Duration> {
    match pttl {
        -2 => Some(Duration::ZERO),
        ms if ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
        _ => None,
    }
}

/// A small random delay, so waiters woken by the same expiry do not all try
/// in the same millisecond.
pub(crate) fn jitter(max: Duration) -> Duration {
    let max_us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
    Duration::from_micros(getrandom::u64().unwrap_or(0) % max_us)
}

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
        answer.map_err(|e| self.name_refusal(e, About::Lock(&req.key)))
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.key, &self.options.shown)?;
        // Behind Sentinel, through a failover within the wait (`ride_through.rs`).
        self.riding_failovers(req, deadline).await
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
        let turn = self.batchers.as_ref().map(|b| {
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
