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
//!   a single server), queued requests go out together, up to eight per
//!   script call, which runs the same steps for each key, to spare the
//!   server the fixed cost of a script per key (see `batching.rs` in the
//!   source).
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

// The files of this backend, floor by floor, bottom first (each folder's module doc says what it
// holds; `dlock/tests/layers.rs`'s `BACKEND_FLOORS` checks that a floor uses only those below it;
// every file may use this one, the backend type its `impl` blocks extend):
// 1. `config.rs` (`RedisOptions`: every URL form, every option) and, by what they configure,
//    `config/clients.rs` (the `redis` crate's clients: socket options, TLS), `config/sentinel.rs`
//    (the sentinels, the master, their credentials, open sentinels refused before a master
//    password), `config/replicas.rs`, `config/waiting.rs` (`?recheck_ms=`, `?foreign_share=`),
//    `config/layout.rs` (`?layout=`). Beside it, `protocol/`: `scripts.rs` (the scripts, `KeyNames`,
//    `run`: the one NOSCRIPT reload), `scripts/queue_lua.rs` and `scripts/layout_lua.rs` (the Lua
//    text of the queue and of the other layout's lock), `scripts/many.rs` (batches, all-keys),
//    `compare_set.rs` (Lua-free `SET … IFEQ`), `renew_many.rs` (up to 100 renewals a call).
// 2. `transport/`: `connection.rs` (one server's connection on dlock's runtime, and one per
//    multi-thread runtime that makes requests), `lanes.rs` (which connection a request goes on;
//    `following`: a task that keeps the lane it was started from), `cluster.rs`, `retiring.rs`.
// 3. `topology/`: `sentinel.rs` (asks the sentinels, follows `+switch-master`, `READONLY` and lost
//    connections; the failed request sent once more to the new master), `sentinel/listed.rs`
//    (`SENTINEL REPLICAS`: the replicas a grant must reach), `server.rs` (one connection or the
//    Sentinel master followed), `replicas.rs` (`WAIT` after every grant and renewal, shared per
//    server), `replicas/count.rs` (`?replicas=auto`: `INFO replication` per master, per slot on a
//    Cluster, joined with the sentinels' list), `replicas/replicated.rs` (an unacknowledged grant
//    given back and asked for again; a grant answered across a Sentinel switch not trusted),
//    `eviction.rs` (`INFO memory`: a server that may evict lock keys refused at connect and
//    again before the next grant after a reconnect or failover).
// 4. `calls/`: `requests.rs` (one request bounded by the caller's deadline; the acquire
//    script's answer), `batching.rs` (queues, a pair per lane), `batching/ops.rs`, `batching/hand_over.rs`
//    (slots given back send the next batches one after another, never nested), `unfinished.rs`
//    (a grant whose caller went away is released).
//    Then `waiting/`, made of requests: `subscriber.rs` (channels; `subscriber/task.rs`, the pub/sub connection;
//    `subscriber/turn.rs`, a ticket, its turn and the backend's turn channel;
//    `subscriber/waiting.rs`, the one wait loop of locks, several keys and read-write leases;
//    `subscriber/holding.rs`, held locks' keyspace channels and the loss alarm they ring),
//    `waiter_queue.rs` (a lock's waiters queue on the server; the release wakes the live head,
//    which takes the key, after a gap for clients that do not queue where one was seen or on a
//    key handed on for over a second),
//    `turns.rs` (the heartbeat that keeps a backend's tickets alive, but a turn left untaken),
//    `recheck.rs` (the re-check's schedule, its `PTTL` and the keyspace channel).
// 5. `kinds/`: `lock_backend.rs` (the `LockBackend` calls), `renew.rs`, `permits.rs`
//    (`PermitBackend`), `rw.rs` + `rw/` (`RwBackend`; `AbandonIfDropped`: a lease or a waiting
//    writer's mark), `election.rs` + `election/announced.rs` (`ElectionBackend`: the record
//    `<lock>:leader`, the channel `<lock>:elected`, the announcements `<lock>:terms`),
//    `all_keys.rs` (`AllKeysBackend`, single server only), `inspect.rs`, `refused.rs` (a refusal
//    named with the ACL grant it lacks), `ride_through.rs` (a lock's wait: queued, acknowledged,
//    a grant given up released; behind Sentinel a `Backend` error tried again until the wait
//    ends), `mix.rs` (one name, one lock across layouts: the check after a grant on a Cluster).
// 6. `layout/`: `redisson.rs` + `redisson/` (Redisson's `RLock` layout, a `RedisBackend` wrapped).
// 7. `connect.rs` (connecting, and what the connection found out about the server), and
//    `for_redlock.rs` (what Redlock uses; feature `redlock`).
mod calls;
mod config;
mod connect;
#[cfg(feature = "redlock")]
mod for_redlock;
mod kinds;
mod layout;
pub(crate) mod protocol;
mod topology;
pub(crate) mod transport;
pub(crate) mod waiting;

pub use self::kinds::refused::{ACL_COMMANDS, ACL_LIST_COMMANDS};
pub use self::layout::redisson;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;

use self::transport::cluster::ClusterConn;

use self::calls::batching::LaneBatchers;
use self::config::RedisOptions;
#[cfg(feature = "redlock")]
pub(crate) use self::for_redlock::nap_until;
use self::topology::eviction;
use self::topology::replicas::ReplicaAck;
use self::topology::server::Server;
use self::transport::connection::Reconnects;
#[cfg(feature = "redlock")]
pub(crate) use self::transport::lanes::spawn_following;
#[cfg(feature = "redlock")]
pub(crate) use self::transport::lanes::spawn_in_lane;
use self::waiting::subscriber::Subscriber;
use self::waiting::turns::Beats;
use crate::backend::Lease;
use crate::LockError;

pub(crate) use self::config::asks_for_redisson;
#[cfg(feature = "redlock")]
pub(crate) use self::config::REDIS_PORT;
/// The longest ttl: dlock's own [`MAX_TTL`], checked here
/// too for callers of the backend trait itself. Below it everything the
/// scripts compute from a ttl stays exact: `PX` (Redis takes up to 2^63 ms
/// minus the current time) and the permit scripts' expiry scores (Lua
/// numbers, exact below 2^53 ms).
pub(crate) use crate::lease::ttl::MAX_TTL;

/// Built by `requests.rs`, used by the other files that read an acquire's answer.
pub(crate) use self::calls::requests::{granted, holder_left};

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
    /// Request batching under load, per lane (see `batching.rs` and
    /// `lanes.rs`); single servers only.
    batchers: Option<LaneBatchers>,
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
    /// Counts the connections opened and broken, so the server's settings
    /// are read again after a reconnect or a failover (see `eviction.rs`).
    reconnects: Reconnects,
    /// For which connections the server was found not to evict.
    eviction: eviction::Checked,
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
    Cluster(ClusterConn),
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

/// The backend's own state as every floor reads it (here, in the root
/// file, so that no floor calls a method of a floor above it for it).
impl RedisBackend {
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

    /// The error of a failed request, naming this backend.
    pub(in crate::backends::redis) fn error(&self, e: RedisError) -> LockError {
        LockError::backend(self.options.shown.clone(), e)
    }

    /// Counts one request sent (see [`RedisMetrics::round_trips`]).
    pub(in crate::backends::redis) fn count(&self) {
        self.metrics.round_trips.fetch_add(1, Ordering::Relaxed);
    }
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

/// A small random delay, so waiters woken by the same expiry do not all try
/// in the same millisecond.
pub(crate) fn jitter(max: Duration) -> Duration {
    let max_us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
    Duration::from_micros(getrandom::u64().unwrap_or(0) % max_us)
}
