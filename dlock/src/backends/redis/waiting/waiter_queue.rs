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
//!   (the server's clock in ms when the ticket joined);
//! - `<prefix>:{<key>}:waiters`, a sorted set of everyone waiting, scored by
//!   the server time (ms) at which they count as gone: the tickets, and the
//!   listeners (`listen:<token>`: waiters that do not queue, see below);
//! - `<prefix>:{<key>}:handoff`, kept a second after a queued hand-off and
//!   counted as one under way for a tenth: when the key was vacated, how
//!   long its last holder held it, whether the head leaves a gap, and the
//!   head's ticket (see "Clients that do not queue");
//! - `<prefix>:{<key>}:share`, `hot <ms>` while the key is handed on
//!   (when its run of hand-offs began, or its last probe; kept a last hold
//!   and a second more after each hand-off), `foreign` for 30 s after a
//!   client that does not queue was seen on the key.
//!
//! Every one of them carries an expiry at least as long as its longest
//! entry, so a queue whose waiters all died vanishes by itself. A ticket is
//! a hash of the waiter's owner token under a per-process key, never the
//! token itself (it is published).
//!
//! **Protocol.**
//! - A waiter's first try is the plain acquire: it neither reads nor joins
//!   the queue, so the uncontended cycle pays one `EXISTS` of the queue for
//!   it (a free key with a queue is not taken: it belongs to the queue's
//!   head), and neither do `try_acquire` and a zero wait, which never queue.
//! - After subscribing, each further try is [`ACQUIRE_QUEUED`]: the free key
//!   is taken if nobody live is ahead of this waiter; otherwise the ticket
//!   joins (or keeps its place in) the queue, and the answer is how long to
//!   sleep unless woken.
//! - **Liveness.** A ticket counts as alive for a second (`LIFE_MS`) after it
//!   last proved it: by a try, or by its backend's heartbeat, one script per
//!   `HEARTBEAT` (`scripts/queue_lua.rs`) for all the backend's queued tickets (see `turns.rs`;
//!   not those whose waiter left a turn untaken, its future not polled). A
//!   waiter tries only when woken: its turn, the holder's expiry, or (the
//!   head alone) a keyspace event. A waiter killed, stopped or cut off thus
//!   drops out of the line within a second: the next release skips it
//!   instead of handing it a turn, and the waiter behind it is served. A
//!   waiter that comes back after its ticket lapsed queues again at the end.
//! - A release (`RELEASE`, batched or not) calls [`QUEUE_FUNCTIONS`]'
//!   `vacate`: with nobody waiting it is a `DEL` (no `PUBLISH` at all); with
//!   a live head it deletes the key and publishes `turn:<ticket>` on the
//!   channel the ticket names, its backend's own (see `turns.rs`): only
//!   that process hears it, and it wakes that one waiter; with only
//!   listeners left it publishes `1` on the key's channel, as every release
//!   did before.
//! - A waiter that gives up (its wait ran out, its future was dropped)
//!   leaves: its ticket goes, and if the key is free the next head is woken.
//!
//! **Clients that do not queue** (redis-py's `Lock`, a `SET NX PX` loop)
//! see the key free between two queued holders: the turn is not written
//! into the key. A head woken by a release waits a gap before it takes the
//! key, `foreign_share / (100 - foreign_share)` of the time the last holder
//! held it (`?foreign_share=`, percent, default 30: the key is free 30 %
//! of the time while the queue hands it on; at most 100 ms; 0 takes at
//! once). Measured with 2 redis-py `Lock` loops beside 3 dlock processes
//! (50 ms sections): redis-py had 0.5 % of the sections at 0, 9 % at 20,
//! 29 % at 50. A free key is anybody's: whoever's `SET NX` comes first takes it,
//! and the queue waits for that holder as for any other. How long the last
//! holder held the key is read from its fence, the server's clock at the
//! grant (see `scripts.rs`). Holds under a few ms give no gap at all, so a
//! hot key that dlock alone hands on loses nothing.
//!
//! The gap is paid only where such a client is, or may be and could
//! starve:
//! - **Seen** (`foreign`, for 30 s): a head found the key handed to it
//!   held by somebody else (`foreign_took`: only a client that does not
//!   queue takes a key with a live queue), or a queued try found the key
//!   held by a value not shaped as dlock's owner tokens (`met_holder`:
//!   32 hex digits, `@`, the client name; redis-py's token is 32 hex
//!   digits alone). Every hand-off leaves its gap.
//! - **Hot** (`hot <ms>`): a key handed on continuously for a second or
//!   more gets a probe once a second, a hand-off with its gap, so that a
//!   poller that never found the key free (redis-py's blocking `Lock`
//!   beside a queue that never empties) gets in, and its take turns the
//!   share on. A run of hand-offs starts at a hand-off that finds no
//!   record, and lasts while each comes within the last hold and a second
//!   (`HOT_REST_MS`) of the one before; a key that rests longer starts a
//!   new run. A key handed on now and then (a per-entity key,
//!   `order:{id}`) thus never pays a gap; a poller gets it while it rests.
//!
//! Cost: every hand-off reads the fence (the last hold) and the record and
//! writes the record (a `GET`, a `GET`, a `SET` in the releasing script);
//! a queued try that finds the key held matches its value. With only dlock
//! clients and 100 ms holds (`bench --first-handoff`), the first hand-off
//! of each of 20 keys: p50 2.1 ms (before, every first hand-off was a
//! probe: 49.5 ms); one key handed on 20 times: p50 2.2 ms. redis-py
//! beside three dlock processes on one hot key still gets its share (its
//! first take in a probe's gap turns the share on).
//!
//! **What it does not rely on.** A lost `turn` message (a subscription
//! being re-established) costs the head at most a heartbeat: the next
//! heartbeat of any queued process finds the key free with no hand-off
//! under way and wakes the head again. A foreign release (`DEL`, an expiry,
//! redis-py's release) announces nothing; the head notices it by keyspace
//! notifications, or the next heartbeat wakes it. Where the server refuses
//! dlock's channels (an ACL), no turn can arrive, and queued waiters try
//! every heartbeat themselves, as before.
//!
//! **Who does not queue.** A `MultiLock` taking all its keys in one script,
//! and Redlock's waiters, register as listeners: a release with nobody
//! queued but a listener live publishes `1`, as before. Redlock has no queue
//! because a queue per master can disagree between masters (different
//! heads on different masters give nobody a majority of turns, and the
//! turns lapse); a fair order over independent masters would need its own
//! agreement protocol.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::Script;

use crate::backend::{AcquireRequest, Lease};
use crate::backends::redis::protocol::scripts::queue_lua::QUEUE_FUNCTIONS;
use crate::backends::redis::protocol::scripts::{self, millis, KeyNames, ACQUIRE_FUNCTIONS};
use crate::backends::redis::waiting::subscriber::turn::Ticket;
use crate::backends::redis::{Attempt, RedisBackend};
use crate::LockError;

/// A waiter's try after its first: KEYS lock and fence; ARGV token, ttl in
/// ms, release channel, ticket, the waiter's `foreign_share` (percent), and
/// last the fence counter's retention in ms (as every script with `fence`).
/// Answers as `ACQUIRE` does: `{1, fence}`, or `{0, ms, behind}` with how
/// long to sleep unless woken (the holder's time left; `-1` for a holder
/// without expiry), and `behind` 1 when a ticket is ahead of this one (it
/// then leaves the key's messages, keyspace events, to that head: its own
/// turn comes to it).
///
/// The free key is this waiter's when no live ticket is ahead of it (once
/// the gap of a hand-off to it has passed); a free key with someone else
/// ahead wakes that waiter (unless a release just did), and this one keeps
/// its place. Every try that
/// does not take the key proves the ticket alive for another
/// `LIFE_MS`. A key holding the token already is a retry whose first
/// answer was lost: answered as `ACQUIRE` answers it.
pub(crate) static ACQUIRE_QUEUED: LazyLock<Script> = LazyLock::new(|| {
    let queued = r"
local lock, token, ttl, channel, ticket = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local share = tonumber(ARGV[5])
local holder = redis.call('GET', lock)
if holder == token then
  leave_line(lock, ticket)
  return {acquire(lock, KEYS[2], token, ttl)}
end
if holder then
  -- The key was handed to this waiter and somebody took it meanwhile: a
  -- client that does not queue, which gets its share from now on.
  foreign_took(lock, ticket)
  met_holder(lock, holder)
  wait_in_line(lock, ticket, true, LIFE_MS)
  -- Behind anybody, live or not: the release skips the dead ones.
  local behind = 0
  if redis.call('ZRANGE', lock .. ':queue', 0, 0)[1] ~= ticket then
    behind = 1
  end
  return {0, redis.call('PTTL', lock), behind}
end
local head = head_of(lock, ticket)
if head and head ~= ticket then
  if not handing_off(lock) then
    wake(head, channel)
  end
  wait_in_line(lock, ticket, true, LIFE_MS)
  return {0, LIFE_MS, 1}
end
if head then
  local gap = gap_left(lock, share)
  if gap > 0 then
    wait_in_line(lock, ticket, true, LIFE_MS)
    return {0, gap}
  end
end
local other = other_layout_left(lock)
if other then
  -- Held in Redisson's layout (see `layouts.rs`), whose release does not
  -- wake this waiter: it tries again soon, keeping its place.
  wait_in_line(lock, ticket, true, LIFE_MS)
  return {0, other}
end
leave_line(lock, ticket)
redis.call('SET', lock, token, 'PX', ttl)
-- One reading of the clock for the queue and the fence.
now = queue_clock_us
-- The lock key as the counter: `?fence=off` (see `ACQUIRE_FUNCTIONS`).
if KEYS[2] == lock then
  return {1, 0}
end
return {1, fence(KEYS[2], ttl)}
";
    Script::new(&format!("{ACQUIRE_FUNCTIONS}{QUEUE_FUNCTIONS}{queued}"))
});

/// A waiter leaves the queue: KEYS lock; ARGV ticket, release channel. If
/// the key is free, the next head is woken (the key may have been vacated
/// for the waiter that leaves).
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    let leave = r"
leave_line(KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = head_of(KEYS[1])
  if head then
    wake(head, ARGV[2])
  end
end
return 1
";
    Script::new(&format!("{QUEUE_FUNCTIONS}{leave}"))
});

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
        // Whether a try of this wait was answered (see `within`).
        let heard = std::sync::atomic::AtomicBool::new(false);
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
                        &heard,
                    )
                },
            )
            .await;
        match (&waited, leaving) {
            (Ok(Some(_)), Some(mut leaving)) => leaving.stay(),
            // A wait that ran out returns once its ticket is gone, so that a
            // try right after (this process's or another's) finds the free
            // key free, not kept for a waiter that has left.
            (Ok(None), Some(leaving)) => leaving.leave_within(LEAVE_BOUND).await,
            _ => {}
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
            .arg(self.fence_key(names))
            .arg(&req.token)
            .arg(millis(req.ttl))
            .arg(&names.channel)
            .arg(ticket)
            .arg(self.options.foreign_share)
            .arg(self.fence_retention_ms());
        let answer: Vec<i64> = self.eval(&ACQUIRE_QUEUED, &call).await?;
        let (won, value, behind) = match answer[..] {
            [won, value] => (won, value, false),
            [won, value, behind] => (won, value, behind == 1),
            _ => {
                return Err(LockError::backend(
                    self.options.shown.clone(),
                    format!("the queued acquire answered {answer:?}, not 2 or 3 numbers"),
                ))
            }
        };
        Ok(match self.attempt_answer(req, names, sent, won, value)? {
            Attempt::Held(left) if behind => Attempt::Behind(left),
            attempt => attempt,
        })
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
            done: None,
        }
    }
}

/// How long a wait that ran out waits for its ticket's leave to be
/// answered before it returns anyway (the leave then lands later, and the
/// ticket lapses within `LIFE_MS` if it never does).
const LEAVE_BOUND: Duration = Duration::from_millis(100);

/// Takes a waiter's ticket out of its queue when dropped (see
/// [`RedisBackend::leave_on_drop`]).
pub(crate) struct Leaving {
    conn: Option<crate::backends::redis::Conn>,
    lock: String,
    channel: String,
    ticket: String,
    /// Told when the leave is answered (see [`Leaving::leave_within`]).
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Leaving {
    /// The waiter took the key: the acquire script already removed the
    /// ticket.
    pub(crate) fn stay(&mut self) {
        self.conn = None;
    }

    /// Leaves now, and waits up to `bound` for the server's answer.
    async fn leave_within(mut self, bound: Duration) {
        let (done, answered) = tokio::sync::oneshot::channel();
        self.done = Some(done);
        drop(self);
        let _ = tokio::time::timeout(bound, answered).await;
    }
}

impl Drop for Leaving {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let mut call = scripts::evalsha(&LEAVE, 1);
        call.arg(&self.lock).arg(&self.ticket).arg(&self.channel);
        let done = self.done.take();
        // In the waiter's lane: behind its join on the same connection.
        crate::backends::redis::transport::lanes::spawn_following(async move {
            let left: Result<i64, _> = match conn {
                crate::backends::redis::Conn::Single(mut c) => {
                    scripts::run(&mut c, &LEAVE, &call).await
                }
                crate::backends::redis::Conn::Cluster(mut c) => {
                    scripts::run(&mut c, &LEAVE, &call).await
                }
            };
            if let Err(e) = left {
                // The ticket expires by itself; a turn it holds lapses.
                tracing::debug!(error = %e, "leaving a waiter queue failed");
            }
            if let Some(done) = done {
                let _ = done.send(());
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::redis::protocol::scripts::queue_lua::HEARTBEAT;

    /// The Lua's number after `local NAME = `.
    fn lua_const(name: &str) -> u64 {
        let at = QUEUE_FUNCTIONS
            .find(&format!("local {name} = "))
            .unwrap_or_else(|| panic!("{name} is defined"));
        let rest = &QUEUE_FUNCTIONS[at + name.len() + 9..];
        rest[..rest.find('\n').unwrap()].parse().unwrap()
    }

    #[test]
    fn a_live_waiter_beats_three_times_per_ticket_life() {
        let life = Duration::from_millis(lua_const("LIFE_MS"));
        assert!(HEARTBEAT * 3 <= life, "{HEARTBEAT:?} x 3 > {life:?}");
        assert!(
            life <= Duration::from_secs(1),
            "a dead waiter drops out within a second"
        );
        assert_eq!(lua_const("GAP_CAP_MS"), 100);
    }
}
