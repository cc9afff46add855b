//! Replica acknowledgement: a write that grants or extends a lease counts
//! only once enough replicas have it (`WAIT`), so a failover that promotes
//! one of them keeps the lease.
//!
//! Why: Redis replicates asynchronously. A master that grants a lease and
//! dies before the write reaches its replica leaves a promoted replica
//! without the key, and a second client is granted the same lock. `WAIT n
//! timeout` after the write blocks until `n` replicas acknowledged every
//! write this connection sent before it (so the grant too, and anything
//! pipelined with it), or the timeout passes, and answers how many did.
//!
//! How many (`?replicas=`): `auto` asks for every replica of the master
//! (on a Cluster, of the key's shard master): those connected to it and,
//! behind Sentinel, those the sentinels list, connected or not (see
//! `count.rs` for how the count is read, cached and lowered). While a
//! replica is away, grants fail as unacknowledged. A number asks for
//! exactly that many; 0 (or `auto` with no replica) sends no `WAIT` at all.
//!
//! What it does not give: `WAIT` is not consensus. A failover can still
//! promote a replica that had not acknowledged (one that was cut off and
//! still counted as connected, with `replicas` below the number of
//! replicas), and a write acknowledged by a replica that is then lost too is
//! gone; see Redis in [`crate::guide::backends`] and [`crate::guide::guarantees`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::RedisResult;

use crate::backend::{AllOrNone, Lease};
use crate::backends::redis::config::{replica_timeout, Replicas};
use crate::backends::redis::transport::lanes::PerRuntime;
use crate::backends::redis::Conn;

mod count;
mod replicated;

/// The pause before a grant that too few replicas acknowledged is asked for
/// again: a replica's link does not come back within microseconds.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A grant or renewal that too few replicas acknowledged in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unacknowledged {
    pub(crate) acknowledged: u32,
    pub(crate) needed: u32,
}

/// A guard that gives a grant back when dropped, until disarmed.
pub(crate) trait Disarm {
    /// The caller owns the grant now.
    fn disarm(&mut self);
}

impl<D: Disarm> Disarm for Vec<D> {
    fn disarm(&mut self) {
        self.iter_mut().for_each(Disarm::disarm);
    }
}

/// An answer to an acquisition that may hold a grant to acknowledge.
pub(crate) trait Grant {
    /// A lease granted by the write to acknowledge (any one of several
    /// granted by one write); `None`: nothing was granted.
    fn lease(&self) -> Option<&Lease>;
}

impl Grant for Option<Lease> {
    fn lease(&self) -> Option<&Lease> {
        self.as_ref()
    }
}

impl Grant for AllOrNone {
    fn lease(&self) -> Option<&Lease> {
        match self {
            AllOrNone::Taken(leases) => leases.first(),
            AllOrNone::Held { .. } => None,
        }
    }
}

/// The replica acknowledgement of one backend.
#[derive(Debug)]
pub(crate) struct ReplicaAck {
    replicas: Replicas,
    timeout: Option<Duration>,
    /// `?aof=true`: `WAITAOF`, the master's own fsync counting as one more.
    aof: bool,
    /// `auto`'s replica counts and when each was read: one for a single
    /// server (`None`), one per slot in use on a Cluster.
    counts: Mutex<HashMap<Option<Slot>, count::Count>>,
    /// One server's `WAIT`s on the background connection, shared by the
    /// grants that finished before each was sent (see [`Shared`]).
    shared: Arc<Shared>,
    /// The same on each lane's connection (see `lanes.rs`): a `WAIT` covers
    /// the writes of the connection it is sent on, so each lane has its own.
    lane_waits: PerRuntime<Shared>,
}

/// Group commit of `WAIT`s on one server's connection. A `WAIT` blocks the
/// connection it is sent on until it returns, so one per grant would queue
/// every request behind the previous grant's replicas. But a `WAIT` covers
/// every write the connection sent before it: each grant whose answer has
/// arrived when a `WAIT` is *sent* is covered by it. So at most one `WAIT`
/// is in flight; grants that finish meanwhile wait for the next one, sent
/// as soon as the current one returns, for all of them at once.
#[derive(Debug)]
struct Shared {
    /// `WAITAOF` instead of `WAIT`.
    aof: bool,
    round: Mutex<Round>,
    /// The last `WAIT` that returned: its number and its answer.
    done: tokio::sync::watch::Sender<Done>,
}

/// The last `WAIT` that returned: its number and its answer.
type Done = (u64, Option<RedisResult<u32>>);

/// What the next `WAIT` must cover.
#[derive(Debug, Default)]
struct Round {
    /// The number the next `WAIT` will have; a grant finished now is
    /// covered by it (it is sent later) and by every later one.
    next: u64,
    /// A task is sending `WAIT`s.
    sending: bool,
    /// The most replicas and the longest wait asked of the next `WAIT`.
    needed: u32,
    timeout: Duration,
    /// The highest `WAIT` number somebody waits for.
    wanted: u64,
}

impl ReplicaAck {
    pub(crate) fn new(replicas: Replicas, timeout: Option<Duration>, aof: bool) -> Self {
        ReplicaAck {
            replicas,
            timeout,
            aof,
            counts: Mutex::new(HashMap::new()),
            shared: Arc::new(Shared::new(aof)),
            lane_waits: PerRuntime::default(),
        }
    }

    /// Whether acknowledgement is off (`replicas=0` without `aof`): no
    /// request at all.
    pub(crate) fn is_off(&self) -> bool {
        self.replicas == Replicas::Exactly(0) && !self.aof
    }

    /// Whether no acknowledgement is needed, as known without a request:
    /// off, or `auto` (without `aof`) with a fresh count of no replica for
    /// the master of `lock_key`: what [`confirm`](Self::confirm) would
    /// answer at once, without the boxed future it needs otherwise.
    pub(crate) fn none_needed_now(&self, conn: &Conn, lock_key: &str) -> bool {
        if self.is_off() {
            return true;
        }
        if self.aof || self.replicas != Replicas::Auto {
            return false;
        }
        let slot = matches!(conn, Conn::Cluster(_)).then(|| Slot::for_key(lock_key));
        self.lock()
            .get(&slot)
            .is_some_and(|known| known.fresh() == Some(0))
    }

    /// Forgets every replica count (the master changed: a failover).
    pub(crate) fn forget(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Option<Slot>, count::Count>> {
        lock(&self.counts)
    }

    /// Waits until enough replicas acknowledged every write `conn` sent so
    /// far to the master of `lock_key` (the key of the lease just granted or
    /// extended, with its `ttl`). `Ok(Err(..))`: too few did in time.
    pub(crate) async fn confirm(
        &self,
        conn: &Conn,
        lock_key: &str,
        ttl: Duration,
    ) -> RedisResult<Result<(), Unacknowledged>> {
        let replicas = match self.replicas {
            Replicas::Exactly(n) => n,
            Replicas::Auto => self.auto_count(conn, lock_key, false).await?,
        };
        // With `aof`, the master's own fsync is one more acknowledgement.
        let local = u32::from(self.aof);
        let needed = replicas + local;
        if needed == 0 {
            return Ok(Ok(()));
        }
        let timeout = self.timeout.unwrap_or_else(|| replica_timeout(ttl));
        let acknowledged = match conn {
            Conn::Cluster(_) => {
                let answer = route(conn, lock_key, ack_cmd(self.aof, replicas, timeout)).await?;
                acknowledgements(self.aof, &answer)?
            }
            Conn::Single(_) => {
                let shared = self.lane_waits.here(|_| Shared::new(self.aof));
                let shared = shared.as_ref().unwrap_or(&self.shared);
                Shared::wait(shared, conn, replicas, timeout).await?
            }
        };
        if acknowledged >= needed {
            return Ok(Ok(()));
        }
        if self.replicas == Replicas::Auto {
            // A replica may have gone away since the count was read: what
            // counts is the count now (see `count.rs` for when a lower one
            // is not believed).
            let now_connected = self.auto_count(conn, lock_key, true).await?;
            if acknowledged >= now_connected + local {
                return Ok(Ok(()));
            }
        }
        Ok(Err(Unacknowledged {
            acknowledged,
            needed,
        }))
    }
}

/// `WAIT replicas timeout`, or with `aof` `WAITAOF 1 replicas timeout`
/// (the master's own AOF fsynced, and `replicas` replicas'); a timeout of
/// 0 blocks for ever: at least a millisecond.
fn ack_cmd(aof: bool, replicas: u32, timeout: Duration) -> redis::Cmd {
    let ms = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut wait = if aof {
        let mut cmd = redis::cmd("WAITAOF");
        cmd.arg(1);
        cmd
    } else {
        redis::cmd("WAIT")
    };
    wait.arg(replicas).arg(ms);
    wait
}

/// The acknowledgements an [`ack_cmd`] answered: `WAIT`'s count, or
/// `WAITAOF`'s `[local, replicas]` added up (the local fsync counts as one).
fn acknowledgements(aof: bool, answer: &redis::Value) -> RedisResult<u32> {
    let count = |v: &redis::Value| match v {
        redis::Value::Int(n) => u32::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    match answer {
        redis::Value::Array(parts) if aof => Ok(parts.iter().take(2).map(count).sum()),
        redis::Value::Int(_) if !aof => Ok(count(answer)),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "an unexpected answer to WAIT or WAITAOF",
            format!("{other:?}"),
        ))),
    }
}

impl Shared {
    fn new(aof: bool) -> Self {
        Shared {
            aof,
            round: Mutex::new(Round::default()),
            done: tokio::sync::watch::channel((0, None)).0,
        }
    }

    /// How many acknowledged a `WAIT` (or `WAITAOF`, counting the master's
    /// own fsync) sent after this call, so covering every write the
    /// connection sent before it, asking for at least `needed` replicas
    /// within `timeout`.
    async fn wait(
        shared: &Arc<Shared>,
        conn: &Conn,
        needed: u32,
        timeout: Duration,
    ) -> RedisResult<u32> {
        let mut done = shared.done.subscribe();
        let (mine, lead) = {
            let mut round = lock(&shared.round);
            round.needed = round.needed.max(needed);
            round.timeout = round.timeout.max(timeout);
            round.wanted = round.wanted.max(round.next);
            let lead = !std::mem::replace(&mut round.sending, true);
            (round.next, lead)
        };
        if lead {
            // A task of its own, on dlock's runtime: the grants waiting for
            // it must not hang on a caller that went away. In this lane:
            // a `WAIT` covers the writes of its own connection only.
            crate::backends::redis::transport::lanes::spawn_following(send_waits(
                shared.clone(),
                conn.clone(),
            ));
        }
        let answer = done
            .wait_for(|(number, answer)| answer.is_some() && *number >= mine)
            .await
            .map_err(|_| {
                redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the replica acknowledgement ended unsent",
                ))
            })?;
        answer.1.clone().unwrap_or(Ok(0))
    }
}

/// Sends `WAIT`s one after the other while grants wait for one, each
/// asking for the most replicas and the longest wait asked of it.
async fn send_waits(shared: Arc<Shared>, conn: Conn) {
    loop {
        let (number, needed, timeout) = {
            let mut round = lock(&shared.round);
            if round.wanted < round.next {
                // Every grant so far is covered.
                round.sending = false;
                return;
            }
            let sent = (round.next, round.needed, round.timeout);
            round.next += 1;
            round.needed = 0;
            round.timeout = Duration::ZERO;
            sent
        };
        let answer = match conn.clone() {
            Conn::Single(mut c) => ack_cmd(shared.aof, needed, timeout)
                .query_async::<redis::Value>(&mut c)
                .await
                .and_then(|answer| acknowledgements(shared.aof, &answer)),
            Conn::Cluster(_) => Ok(0),
        };
        shared.done.send_replace((number, Some(answer)));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends `cmd` (keyless) to the master that holds `lock_key`.
async fn route<T: redis::FromRedisValue>(
    conn: &Conn,
    lock_key: &str,
    cmd: redis::Cmd,
) -> RedisResult<T> {
    match conn.clone() {
        Conn::Cluster(mut c) => {
            let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                lock_key,
                SlotAddr::Master,
            )));
            let value = c.route_command(cmd, to).await?;
            redis::from_redis_value(value).map_err(Into::into)
        }
        Conn::Single(mut single) => cmd.query_async(&mut single).await,
    }
}
