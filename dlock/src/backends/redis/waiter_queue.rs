//! Waiting across processes in arrival order: a queue of waiter tickets on
//! the server, beside the lock key, and one wake-up per release.
//!
//! Without it every process waiting for a key heard every release on the
//! key's channel and tried at once; one won, the others went back to sleep,
//! and the process that had just released usually won again (its next local
//! waiter was first in line on a warm connection). With 50 processes a
//! critical section cost 51 scripts and the slowest process waited seconds.
//!
//! **Layout.** Beside the lock key `<prefix>:{<key>}`, in its hash slot:
//! - `<prefix>:{<key>}:queue`, a sorted set of tickets scored by arrival
//!   (the server's clock in ms when the ticket first joined);
//! - `<prefix>:{<key>}:waiters`, a sorted set of everyone waiting, scored by
//!   the server time (ms) at which they count as gone: the tickets, and the
//!   listeners (`listen:<token>`: waiters that do not queue, see below).
//!
//! Both sets carry an expiry at least as long as the longest entry, so a
//! queue whose waiters all died vanishes by itself. A ticket is a random
//! hex string drawn per wait, never the owner token (it is published).
//!
//! **Protocol.**
//! - A waiter's first try is the plain acquire (`SET NX`): it neither reads
//!   nor joins a queue, so the uncontended cycle pays nothing for it, and
//!   neither do `try_acquire` and a zero wait, which never queue.
//! - After subscribing, each further try is [`ACQUIRE_QUEUED`]: the key is
//!   taken if it is free and nobody live is ahead, or if it holds this
//!   waiter's turn; otherwise the ticket joins (or stays in) the queue with
//!   an expiry past the holder's remaining time, and the answer is that
//!   time, which the waiter sleeps unless woken.
//! - A release (`RELEASE`, batched or not, and a waiter's leaving) calls
//!   [`QUEUE_FUNCTIONS`]' `vacate`: with nobody waiting it is a `DEL` (no
//!   `PUBLISH` at all); with a live head it writes `turn:<ticket>` into the
//!   lock key for a second (`TURN_MS`) and publishes `turn:<ticket>` on the key's
//!   channel, which wakes that one waiter and nobody else; with only
//!   listeners left it deletes and publishes `1`, as every release did before.
//! - The turn is in the lock key itself, so a newcomer's `SET NX` (dlock's,
//!   redis-py's, anybody's) cannot take the key while a turn is pending, and
//!   checking for it costs the uncontended path nothing.
//! - A waiter that gives up (its wait ran out, its future was dropped)
//!   leaves: its ticket goes, and a turn it was given passes on at once.
//!
//! **What it does not rely on.** A dead waiter's ticket expires after the
//! holder's remaining time and a margin; a turn given to a waiter that
//! died lapses after a second, which the other waiters notice as an expiry
//! (keyspace notifications or their re-check) and the next try hands the
//! turn on. A foreign release (`DEL`, an expiry, redis-py's release)
//! announces nothing; waiters notice it the same way, and the first try
//! after it gives the turn to the head. A client that does not queue takes a
//! free key when it finds one; the queue then waits for it.
//!
//! **Who does not queue.** A `MultiLock` taking all its keys in one script,
//! and Redlock's waiters, register as listeners: a release with nobody
//! queued but a listener live publishes `1`, as before. Redlock has no queue
//! because a queue per master can disagree between masters (different
//! heads on different masters give nobody a majority of turns, and the
//! turns lapse); a fair order over independent masters would need its own
//! agreement protocol.

use std::hash::{BuildHasher, RandomState};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use redis::Script;

use super::scripts::{self, millis, KeyNames, ACQUIRE_FUNCTIONS};
use super::{Attempt, RedisBackend};
use crate::backend::{AcquireRequest, Lease};
use crate::LockError;

/// The Lua of the queue (`TURN_MS` is how long a turn waits for its waiter
/// to take it: a live waiter is woken at once and takes it within a round
/// trip; one that died blocks its key this long), shared by the scripts that release a lock key and
/// by the queued acquire. The lock key's queue sets are named from the key
/// itself (same hash tag, so the same cluster slot; an ACL key pattern
/// `~<prefix>:*` covers them).
///
/// - `head_of(lock)`: the first live ticket, dropping dead ones on the way.
/// - `give_turn(lock, ticket, channel)`: the key becomes `turn:<ticket>` for
///   the turn's length, and only that ticket's waiter is woken.
/// - `vacate(lock, channel)`: frees a key whose holder (or turn) ended: to
///   the head's turn, or deleted (announced only if a listener waits).
/// - `wait_in_line(lock, who, queued, life)`: keeps `who` waiting for
///   `life` ms more (a ticket also joins the queue, keeping its place).
/// - `life_for(left, ttl)`: how long a waiter that will sleep `left` ms
///   (the holder's time; `ttl` if unknown) counts as alive.
pub(crate) const QUEUE_FUNCTIONS: &str = r"
local TURN_MS = 1000
local queue_clock
local function now_ms()
  if not queue_clock then
    local t = redis.call('TIME')
    queue_clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return queue_clock
end
local function head_of(lock)
  local queue, waiters = lock .. ':queue', lock .. ':waiters'
  while true do
    local first = redis.call('ZRANGE', queue, 0, 0)[1]
    if not first then
      return nil
    end
    local gone_at = tonumber(redis.call('ZSCORE', waiters, first))
    if gone_at and gone_at > now_ms() then
      return first
    end
    redis.call('ZREM', queue, first)
    redis.call('ZREM', waiters, first)
  end
end
local function give_turn(lock, ticket, channel)
  redis.call('ZREM', lock .. ':queue', ticket)
  redis.call('ZREM', lock .. ':waiters', ticket)
  redis.call('SET', lock, 'turn:' .. ticket, 'PX', TURN_MS)
  redis.pcall('PUBLISH', channel, 'turn:' .. ticket)
end
local function vacate(lock, channel)
  local waiters = lock .. ':waiters'
  if redis.call('EXISTS', waiters) == 0 then
    redis.call('DEL', lock)
    return
  end
  local head = head_of(lock)
  if head then
    give_turn(lock, head, channel)
    return
  end
  redis.call('DEL', lock)
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now_ms())
  if redis.call('EXISTS', waiters) == 1 then
    redis.pcall('PUBLISH', channel, '1')
  end
end
local function keep_for(key, life)
  if redis.call('PTTL', key) < life then
    redis.call('PEXPIRE', key, life)
  end
end
local function wait_in_line(lock, who, queued, life)
  local queue, waiters = lock .. ':queue', lock .. ':waiters'
  if queued then
    redis.call('ZADD', queue, 'NX', now_ms(), who)
    keep_for(queue, life)
  end
  redis.call('ZADD', waiters, now_ms() + life, who)
  keep_for(waiters, life)
end
local function life_for(left, ttl)
  local base = tonumber(left)
  if base < 0 then
    base = tonumber(ttl)
  end
  return base + math.floor(base / 4) + 1000
end
";

/// A waiter's try after its first: KEYS lock and fence; ARGV token, ttl in
/// ms, release channel, ticket, and last the fence counter's retention in
/// ms (as every script with `fence`). Answers as `ACQUIRE` does: `{1, fence}` or
/// `{0, pttl}`.
///
/// The key is this waiter's when it holds its turn, or when it is free and
/// no live ticket is ahead; a free key with someone else ahead becomes
/// that waiter's turn (a release that published nothing, a lapsed turn),
/// and this waiter keeps its place. A key holding the token already is a
/// retry whose first answer was lost: answered as `ACQUIRE` answers it.
pub(crate) static ACQUIRE_QUEUED: LazyLock<Script> = LazyLock::new(|| {
    let queued = r"
local lock, token, ttl, channel, ticket = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local holder = redis.call('GET', lock)
if holder == token then
  redis.call('ZREM', lock .. ':queue', ticket)
  redis.call('ZREM', lock .. ':waiters', ticket)
  return {acquire(lock, KEYS[2], token, ttl)}
end
-- A turn was taken out of the queue when it was given.
local mine = holder == 'turn:' .. ticket
if not holder then
  local head = head_of(lock)
  if head == ticket then
    redis.call('ZREM', lock .. ':queue', ticket)
    redis.call('ZREM', lock .. ':waiters', ticket)
    mine = true
  elseif head == nil then
    redis.call('ZREM', lock .. ':waiters', ticket)
    mine = true
  else
    give_turn(lock, head, channel)
  end
end
if mine then
  redis.call('SET', lock, token, 'PX', ttl)
  return {1, fence(KEYS[2], ttl)}
end
local left = redis.call('PTTL', lock)
wait_in_line(lock, ticket, true, life_for(left, ttl))
return {0, left}
";
    Script::new(&format!("{ACQUIRE_FUNCTIONS}{QUEUE_FUNCTIONS}{queued}"))
});

/// A waiter leaves the queue: KEYS lock; ARGV ticket, release channel. A
/// turn it was given passes on.
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    let leave = r"
redis.call('ZREM', KEYS[1] .. ':queue', ARGV[1])
redis.call('ZREM', KEYS[1] .. ':waiters', ARGV[1])
if redis.call('GET', KEYS[1]) == 'turn:' .. ARGV[1] then
  vacate(KEYS[1], ARGV[2])
end
return 1
";
    Script::new(&format!("{QUEUE_FUNCTIONS}{leave}"))
});

/// The ticket of the waiter acquiring with owner token `token`: a hash of
/// it under a key drawn once per process, in hex. Tickets are published on
/// the release channel and the token is a secret, so the ticket must not
/// reveal it; derived rather than drawn, so an uncontended acquire (which
/// never queues) costs no randomness for it, and a retry with the same
/// token keeps its place.
fn ticket_of(token: &str) -> String {
    static KEY: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    format!("{:016x}", KEY.hash_one(token))
}

/// A waiter's ticket, derived from its token (see [`ticket_of`]) the
/// first time it is asked for: an acquire that takes a free key at its
/// first try never needs one.
pub(crate) struct Ticket<'a> {
    token: &'a str,
    derived: OnceLock<String>,
}

impl<'a> Ticket<'a> {
    /// The ticket of the waiter with owner token `token`.
    pub(crate) fn of(token: &'a str) -> Self {
        Ticket {
            token,
            derived: OnceLock::new(),
        }
    }

    /// The ticket itself.
    pub(crate) fn get(&self) -> &str {
        self.derived.get_or_init(|| ticket_of(self.token))
    }
}

impl RedisBackend {
    /// A lock's wait: the plain acquire first (uncontended keys never
    /// queue), then queued tries as `ticket` until the key is this
    /// waiter's or `deadline` passes (`Ok(None)`). The ticket leaves the
    /// queue however the wait ends without the key, a dropped future
    /// included.
    pub(crate) async fn wait_in_queue(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
        ticket: &Ticket<'_>,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let mut leaving: Option<Leaving> = None;
        let waited = self
            .wait_for_release(
                &names.channel,
                Some(&names.lock),
                Some(ticket),
                deadline,
                // A key without expiry: retry after the ttl we ask for.
                req.ttl,
                |queued| {
                    if queued && leaving.is_none() {
                        leaving = Some(self.leave_on_drop(names, ticket.get().to_owned()));
                    }
                    let ticket = queued.then(|| ticket.get());
                    self.within(
                        deadline,
                        self.try_in_line(req, names, ticket),
                        Attempt::Held(Some(Duration::ZERO)),
                    )
                },
            )
            .await;
        if let (Ok(Some(_)), Some(leaving)) = (&waited, leaving.as_mut()) {
            leaving.stay();
        }
        waited
    }

    /// One try of a lock's wait, plain or queued as `ticket`: if the future
    /// is dropped (or fails) with the script in flight, the lease it may
    /// have taken is released, not left to its ttl.
    async fn try_in_line(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
        ticket: Option<&str>,
    ) -> Result<Attempt, LockError> {
        let Some(ticket) = ticket else {
            return self.attempt_or_release(req, names).await;
        };
        let mut unfinished = self.release_if_dropped(names, &req.token);
        let answer = self.attempt_queued(req, names, ticket).await?;
        unfinished.disarm();
        Ok(answer)
    }

    /// One queued try (see [`ACQUIRE_QUEUED`]); never batched: only a
    /// waiter that already found the key held sends it.
    pub(crate) async fn attempt_queued(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
        ticket: &str,
    ) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        let mut call = scripts::evalsha(&ACQUIRE_QUEUED, 2);
        call.arg(&names.lock)
            .arg(&names.fence)
            .arg(&req.token)
            .arg(millis(req.ttl))
            .arg(&names.channel)
            .arg(ticket)
            .arg(self.fence_retention_ms());
        let (won, value): (i64, i64) = self.eval(&ACQUIRE_QUEUED, &call).await?;
        self.attempt_answer(req, names, sent, won, value)
    }

    /// A guard that takes `ticket` out of the queue of `names` when dropped
    /// (on dlock's background runtime: a dropped future cannot wait), unless
    /// [`Leaving::stay`] was called because the waiter got the key.
    pub(crate) fn leave_on_drop(&self, names: &KeyNames, ticket: String) -> Leaving {
        Leaving {
            conn: Some(self.conn.clone()),
            lock: names.lock.clone(),
            channel: names.channel.clone(),
            ticket,
        }
    }
}

/// Takes a waiter's ticket out of its queue when dropped (see
/// [`RedisBackend::leave_on_drop`]).
pub(crate) struct Leaving {
    conn: Option<super::Conn>,
    lock: String,
    channel: String,
    ticket: String,
}

impl Leaving {
    /// The waiter took the key: the acquire script already removed the
    /// ticket.
    pub(crate) fn stay(&mut self) {
        self.conn = None;
    }
}

impl Drop for Leaving {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let mut call = scripts::evalsha(&LEAVE, 1);
        call.arg(&self.lock).arg(&self.ticket).arg(&self.channel);
        crate::lease::background::spawn(async move {
            let left: Result<i64, _> = match conn {
                super::Conn::Single(mut c) => scripts::run(&mut c, &LEAVE, &call).await,
                super::Conn::Cluster(mut c) => scripts::run(&mut c, &LEAVE, &call).await,
            };
            if let Err(e) = left {
                // The ticket expires by itself; a turn it holds lapses.
                tracing::debug!(error = %e, "leaving a waiter queue failed");
            }
        });
    }
}
