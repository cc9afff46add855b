//! The Lua scripts and key names of the Redis protocol, shared with Redlock.
//!
//! Keys: `<prefix>:{<key>}` holds the owner token (so `GET`/`PTTL` show who
//! holds it and for how long), `<prefix>:{<key>}:fence` the fencing counter
//! (kept for `?fence_retention=` after its last fence, see
//! [`ACQUIRE_FUNCTIONS`]), and releases are announced on channel `<prefix>:{<key>}:released`
//! (`…:released:db<n>` on a database `n` other than 0, see [`db_channel`]).
//! Waiters queue in `<prefix>:{<key>}:queue` and `…:waiters` (see
//! `waiter_queue.rs`). The braces are a hash tag: all of a lock's keys live
//! in one cluster slot, which is what lets one script touch them all.

use std::sync::LazyLock;

use redis::{RedisResult, Script};

mod layout_lua;
mod many;
pub(crate) mod queue_lua;

pub(crate) use self::layout_lua::other_layout_lua;
pub(crate) use self::many::{ACQUIRE_ALL, ACQUIRE_MANY, RELEASE_MANY};
use self::queue_lua::{queue_liveness_lua, QUEUE_FUNCTIONS};

/// `SET NX PX` and, on success, the next fence (see [`ACQUIRE_FUNCTIONS`]):
/// returns `{1, fence}`, or `{0, pttl}` with the holder's remaining time.
/// KEYS lock, counter; ARGV token, ttl ms, the counter's retention ms.
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ACQUIRE_FUNCTIONS}{ACQUIRE_ONE}")));

/// The Lua shared by every script that takes a lock key: `fence(counter)`
/// issues a fencing token, `acquire(lock, counter, token, ttl_ms)` takes the
/// key (or finds it already taken with `token`) and answers `1, fence` or
/// `0, pttl`. An empty `counter` issues no fence (answers `1, 0`): Redlock
/// has no fencing token, so its acquire is a plain `SET NX PX`. A `counter`
/// that is the lock key itself issues none either: that is `?fence=off`
/// (`RedisBackend::fence_key`), which names the lock key rather than an
/// empty one because a key name must match the ACL user's key pattern and,
/// on a Cluster, share the lock's slot.
///
/// Fences never go backwards, even when the counter is lost (a restart
/// without persistence, a failover to a replica that missed it, an
/// `allkeys-*` eviction, a flush): a fence is `max(last + 1, now)`, where
/// `last` is the counter (the last fence issued for the key) and `now` the
/// server's clock in microseconds since the epoch (`TIME`), and the fence
/// is stored back in the counter. A counter that starts again from nothing
/// thus starts above every fence issued before, as long as the clock of the
/// server that issues the next fence is not behind the clock that issued
/// the last one by more than the time between the two; and while the
/// counter lives, a clock that steps back cannot make a fence repeat.
/// Microseconds stay below 2^53 (JSON-safe integers) until the year 2255.
/// Redis 5 and later replicate scripts by their effects, which is what lets
/// a write follow `TIME`.
///
/// Retention: because of that floor the counter may also go away on
/// purpose, so a service that locks a key per order or job does not keep a
/// counter per key for ever. Every script that issues fences takes the
/// counter's retention in ms (`?fence_retention=`, default one day) as its
/// **last** argument, and each fence stores the counter with
/// `PX max(retention, ttl)`: it lives at least as long as the lease it
/// fenced was first granted for, and `retention` after the last fence. An
/// expired counter is a lost one: the next fence is the clock, above every
/// fence issued before under the assumption above (the clock of the next
/// fence-issuer is not behind the last one's by more than the time between
/// them). The retention moves that assumption from "the counter was lost
/// by accident" to "the counter expired on purpose"; it assumes nothing
/// new.
///
/// Cost: one `SET … GET` of the counter per fence (it reads the last fence
/// and stores the new one in one call), and one `TIME` per script run, not
/// per key: every key of a batch is a different lock, so they may share one
/// reading of the clock. Each `redis.call` costs the server's one thread
/// about a microsecond on Redis 7.0, and these two are what a fenced
/// acquire adds to a plain `SET NX PX`.
///
/// Retries: an acquire that finds the key holding its own token already
/// ran (the client resent it after losing the answer: the cluster client
/// resends a script when its connection breaks before the answer, and
/// Redlock's next round reuses the token on a master whose undo was lost).
/// It answers as the first run did, with the fence issued then (nobody
/// else could take the key since, so the counter has not moved; if the
/// counter itself was lost, a new fence, which is larger), and counts the
/// ttl from now, as the caller's local deadline does. Without this the
/// retry answered "held" by the caller's own token, and the key blocked
/// everyone, its owner included, until its ttl.
///
/// The queue: a free key with a live ticket first in its `:queue` is not
/// taken (the answer is `0, 0`): it belongs to the queue's head, which
/// takes it with `ACQUIRE_QUEUED` (see `waiter_queue.rs`). Dead tickets
/// ahead are dropped on the way (`first_live`, the queue's own rule, see
/// [`queue_liveness_lua`]). That `EXISTS` is all the uncontended acquire
/// pays for the queue.
///
/// The other layout: a free key whose name is held in Redisson's layout is
/// not taken either (the answer is `0` and the time to try again, at most
/// 200 ms): one name is one lock whatever the layout (see `layouts.rs`).
/// That `TYPE` of the name is what the uncontended acquire pays for it.
pub(crate) const ACQUIRE_FUNCTIONS: &str = concat!(
    queue_liveness_lua!(),
    other_layout_lua!(),
    r"
local now
local retention = tonumber(ARGV[#ARGV])
local function fence(counter, ttl)
  if counter == '' then
    return 0
  end
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local keep = math.max(retention, tonumber(ttl))
  local last = tonumber(redis.call('SET', counter, now, 'PX', keep, 'GET'))
  if last and last >= now then
    redis.call('SET', counter, last + 1, 'PX', keep)
    return last + 1
  end
  return now
end
local function live_queue(lock)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return first_live(lock, nil, math.floor(now / 1000)) ~= nil
end
local function acquire(lock, counter, token, ttl)
  if counter == lock then
    counter = ''
  end
  local queued = redis.call('EXISTS', lock .. ':queue') == 1
  if queued and redis.call('EXISTS', lock) == 0 then
    queued = live_queue(lock)
  end
  local other = not queued and other_layout_left(lock)
  if not queued and not other and redis.call('SET', lock, token, 'NX', 'PX', ttl) then
    return 1, fence(counter, ttl)
  end
  if redis.call('GET', lock) == token then
    redis.call('PEXPIRE', lock, ttl)
    local issued = counter ~= '' and tonumber(redis.call('GET', counter))
    if issued then
      return 1, issued
    end
    return 1, fence(counter, ttl)
  end
  local left = redis.call('PTTL', lock)
  if left == -2 then
    -- Free, but waiters queue for it (the queue's head takes it), or the
    -- name is held in Redisson's layout (see `layouts.rs`).
    left = other or 0
  end
  return 0, left
end
"
);

/// The call of [`ACQUIRE`]: one key.
const ACQUIRE_ONE: &str = r"
local won, value = acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return {won, value}
";

/// Compare-and-delete: if ARGV[1] (the token) holds KEYS[1], the key is
/// vacated (see `waiter_queue.rs`): deleted, and the first live queued
/// waiter woken (`turn:<ticket>`, which only that waiter hears), or, with
/// no ticket queued, `1` published on ARGV[2] (the release channel) when a
/// listener waits: with nobody waiting a release is `GET`, `EXISTS`, `DEL`.
///
/// Every announcement uses `redis.pcall`, not `redis.call`: it is a
/// wake-up, not part of the release. A user whose ACL allows no `&dlock:*`
/// channel gets an error from `PUBLISH`; with `call` that error would fail
/// the release after its write (scripts do not roll back), so the caller
/// would see an error for a lock it did release. Waiters of such a user
/// wake by their timers and re-checks.
///
/// The common case, nobody waiting, returns before the queue's Lua is even
/// defined: each `local function` of a script is a closure built on every
/// run, and the uncontended cycle should not pay for them.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    let uncontended = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', KEYS[1] .. ':waiters') == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
";
    let waited_for = r"
vacate_waited(KEYS[1], ARGV[2])
return 1
";
    Script::new(&format!("{uncontended}{QUEUE_FUNCTIONS}{waited_for}"))
});

/// A release that keeps the key for a minimum time (`hold_at_least`): if
/// the token still holds the key, its expiry becomes ARGV[2] ms from now
/// (a compare-and-set of the expiry, not a delete), and nothing is
/// published: waiters wake at the expiry (keyspace `expired` events, or
/// the holder's time left that every refused try answers).
pub(crate) static KEEP_FOR: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
",
    )
});

/// [`ACQUIRE`] on a Redlock master that guards against its own restart
/// (`RedlockBackend::restart_quarantine`). ARGV token, ttl ms, quarantine
/// ms, retention ms (unused: Redlock's counter is empty). KEYS[3] is the master's boot
/// marker, a key without expiry holding the server time (ms) until which
/// it refuses to vote. A master that lost its data (a restart without
/// persistence, a flush) has no marker: it writes one for now + ARGV[3] ms
/// and refuses, answering like a held key with that much time left. Every
/// lease granted before the data loss has expired by then, so no second
/// client can count this master toward a quorum that the first still has.
#[cfg(feature = "redlock")]
pub(crate) static ACQUIRE_GUARDED: LazyLock<Script> = LazyLock::new(|| {
    let quarantine = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local marker = redis.call('GET', KEYS[3])
if not marker then
  redis.call('SET', KEYS[3], now + tonumber(ARGV[3]))
  return {0, tonumber(ARGV[3])}
end
local quarantine = tonumber(marker) - now
if quarantine > 0 then
  return {0, quarantine}
end";
    // A refused try listens (Redlock does not queue: see `waiter_queue.rs`),
    // so the key's release on this master announces itself.
    let listening = r"
local won, value = acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if won == 0 then
  wait_in_line(KEYS[1], 'listen:' .. ARGV[1], false, life_for(value, ARGV[2]))
end
return {won, value}
";
    Script::new(&format!(
        "{quarantine}{ACQUIRE_FUNCTIONS}{QUEUE_FUNCTIONS}{listening}"
    ))
});

/// `EVALSHA <sha1> <numkeys>`: the start of a call of `script`; the caller
/// adds the keys, then the arguments, and runs it with [`run`].
///
/// Built by hand rather than with `Script::key`/`arg`, which copy every key
/// and argument into vectors of their own and then into the same command:
/// on the hot path of every acquire and release that is a dozen allocations.
///
/// Sized up front for a call of a few keys and arguments (the acquire's,
/// the release's): growing the command's buffers argument by argument cost
/// about seven reallocations per request.
pub(crate) fn evalsha(script: &Script, keys: usize) -> redis::Cmd {
    let mut call = redis::Cmd::with_capacity(CALL_ARGS, CALL_BYTES);
    call.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    call
}

/// The arguments and bytes a script call of [`evalsha`] is made room for:
/// enough for the acquire's (two keys and three arguments besides the
/// command, the hash and the key count) with keys and owner tokens of a
/// few dozen bytes; a larger call grows as any vector does.
const CALL_ARGS: usize = 8;
const CALL_BYTES: usize = 256;

/// Runs a call built by [`evalsha`]. If the server lost its script cache
/// (a restart, `SCRIPT FLUSH`), loads `script` and tries once more.
pub(crate) async fn run<'a, T, C>(
    conn: &mut C,
    script: &Script,
    call: impl Into<Call<'a>>,
) -> RedisResult<T>
where
    T: redis::FromRedisValue,
    C: redis::aio::ConnectionLike + Send,
{
    let call = call.into();
    match call.send(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            call.send(conn).await
        }
        answer => answer,
    }
}

/// What [`run`] sends: one script call, or a pipeline of them (renewals).
#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    One(&'a redis::Cmd),
    Pipeline(&'a redis::Pipeline),
}

impl<'a> From<&'a redis::Cmd> for Call<'a> {
    fn from(call: &'a redis::Cmd) -> Self {
        Call::One(call)
    }
}

impl<'a> From<&'a redis::Pipeline> for Call<'a> {
    fn from(pipeline: &'a redis::Pipeline) -> Self {
        Call::Pipeline(pipeline)
    }
}

impl Call<'_> {
    async fn send<T, C>(self, conn: &mut C) -> RedisResult<T>
    where
        T: redis::FromRedisValue,
        C: redis::aio::ConnectionLike + Send,
    {
        match self {
            Call::One(call) => call.query_async(conn).await,
            Call::Pipeline(pipeline) => pipeline.query_async(conn).await,
        }
    }
}

/// The Redis names of one lock key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyNames {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
}

impl KeyNames {
    /// Maps `key` into `prefix`'s namespace. `{`, `}` and `%` are
    /// percent-encoded so a key cannot end the hash tag early (an empty tag
    /// would put the lock and fence keys in different cluster slots).
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        // Built with push_str, not format!: this runs on every acquire and
        // release.
        let mut lock = String::with_capacity(prefix.len() + key.len() + 3);
        lock.push_str(prefix);
        lock.push_str(":{");
        for c in key.chars() {
            match c {
                '%' => lock.push_str("%25"),
                '{' => lock.push_str("%7B"),
                '}' => lock.push_str("%7D"),
                c => lock.push(c),
            }
        }
        lock.push('}');
        let with_suffix = |suffix: &str| {
            let mut name = String::with_capacity(lock.len() + suffix.len());
            name.push_str(&lock);
            name.push_str(suffix);
            name
        };
        KeyNames {
            fence: with_suffix(":fence"),
            channel: with_suffix(":released"),
            lock,
        }
    }
}

impl KeyNames {
    /// These names on database `db` (see [`db_channel`]).
    pub(crate) fn in_db(mut self, db: i64) -> Self {
        db_channel(&mut self.channel, db);
        self
    }
}

/// Makes a release channel `channel` the one of database `db`.
///
/// Pub/sub channels are global to a server, while keys are per database: a
/// waiter on database 2 subscribed to `dlock:{k}:released` was woken by
/// every release of `k` on database 1. So a channel of database `n` other
/// than 0 ends with `:db<n>`; database 0 keeps the names of every earlier
/// version (and a Cluster has only database 0). The scripts publish on the
/// channel they are given, so they need no change.
pub(crate) fn db_channel(channel: &mut String, db: i64) {
    if db != 0 {
        channel.push_str(":db");
        channel.push_str(&db.to_string());
    }
}

/// A whole number of milliseconds for `PX`/`PEXPIRE`, rounded up so the
/// server never holds a lease for less than asked.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    let ms = d.as_millis();
    let whole = if d.as_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    };
    u64::try_from(whole).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn names_share_one_hash_tag() {
        assert_eq!(
            KeyNames::new("dlock", "k").in_db(0).channel,
            "dlock:{k}:released"
        );
        assert_eq!(
            KeyNames::new("dlock", "k").in_db(2).channel,
            "dlock:{k}:released:db2"
        );
        let n = KeyNames::new("dlock", "order:42");
        assert_eq!(n.lock, "dlock:{order:42}");
        assert_eq!(n.fence, "dlock:{order:42}:fence");
        assert_eq!(n.channel, "dlock:{order:42}:released");
    }

    #[test]
    fn braces_in_keys_cannot_break_the_tag() {
        let n = KeyNames::new("dlock", "}x{y%");
        assert_eq!(n.lock, "dlock:{%7Dx%7By%25}");
        assert_ne!(
            KeyNames::new("p", "a}").lock,
            KeyNames::new("p", "a%7D").lock
        );
    }

    #[test]
    fn millis_round_up() {
        assert_eq!(millis(Duration::from_millis(30)), 30);
        assert_eq!(millis(Duration::from_micros(30_001)), 31);
    }
}
