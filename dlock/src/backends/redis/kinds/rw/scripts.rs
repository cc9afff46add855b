//! The Lua scripts of Redis read-write locks (the layout is in `rw.rs`).
//!
//! Every script takes the same five keys, all in the lock's hash slot:
//! KEYS[1] the readers (sorted set: token → expiry, ms on the server's
//! clock), KEYS[2] the writer (string: token, `PX` ttl), KEYS[3] the
//! waiting writers' marks (sorted set: token → mark expiry, ms), KEYS[4]
//! the waiting writers' order (sorted set: token → arrival, µs), KEYS[5]
//! the fence counter. Each reads the server's clock once (`TIME`), so
//! clients with skewed clocks agree on what has expired. Every key expires:
//! the readers and marks with the latest of their scores, the writer with
//! its `PX`, and the counter `?fence_retention=` after the fence it last
//! stored (at least the ttl), which is safe for the reason a lock's
//! counter may expire (`super::scripts`'s `ACQUIRE_FUNCTIONS`): a write's
//! fence is `max(last + 1, now µs)`, and a read's is the counter or, when
//! it is gone, the clock.

use std::sync::LazyLock;

use redis::Script;

/// What every script starts with: the keys, the clock, the pruning of
/// expired readers and marks, and the helpers the acquire scripts share.
///
/// `oldest()` is the waiting writer whose turn it is: the first in arrival
/// order whose mark is live; entries of marks that are gone (expired, or a
/// deleted key) are dropped on the way. `mark(token, ms)` puts a writer in
/// line (keeping its place if it is already) or refreshes its mark.
/// `expire_at_last(set)` makes a sorted set expire with its latest score,
/// so an abandoned lock leaves nothing behind.
const PRELUDE: &str = r"
local readers, writer, waiting, order, counter = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
redis.call('ZREMRANGEBYSCORE', waiting, '-inf', now)
local function expire_at_last(set)
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', set, last[2])
  end
end
local function oldest()
  while true do
    local first = redis.call('ZRANGE', order, 0, 0)[1]
    if not first then
      return nil
    end
    local live = redis.call('ZSCORE', waiting, first)
    if live then
      return first, tonumber(live)
    end
    redis.call('ZREM', order, first)
  end
end
local function mark(token, ms)
  redis.call('ZADD', waiting, now + ms, token)
  redis.call('ZADD', order, 'NX', now_us, token)
  expire_at_last(waiting)
  redis.call('PEXPIREAT', order, redis.call('ZRANGE', waiting, -1, -1, 'WITHSCORES')[2])
end
local function unmark(token)
  redis.call('ZREM', waiting, token)
  redis.call('ZREM', order, token)
end
";

/// A reader's attempt. ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] the fence
/// counter's retention in ms.
///
/// Admitted when no writer holds and no writer's mark is live: the set
/// gets the token with its expiry, and the fence is the counter's value
/// (the last write's fence), set from the clock (µs) if the counter is
/// missing, so that every later write's `max(last + 1, now)` is above it.
/// Returns `{1, fence, 0}`, or `{0, ms to wait, blocker}` with blocker 1
/// (the writer; -1 ms: a writer key without expiry) or 3 (a waiting
/// writer's mark, until it expires). A reader already in the set (a resent
/// attempt whose answer was lost) is admitted again.
pub(super) static ACQUIRE_READ: LazyLock<Script> = LazyLock::new(|| {
    let read = r"
local token, ttl, retention = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local function admit()
  redis.call('ZADD', readers, now + ttl, token)
  expire_at_last(readers)
  local fence = tonumber(redis.call('GET', counter))
  if not fence then
    fence = now_us
    redis.call('SET', counter, fence, 'PX', math.max(retention, ttl))
  end
  return {1, fence, 0}
end
if redis.call('ZSCORE', readers, token) then
  return admit()
end
if redis.call('EXISTS', writer) == 1 then
  return {0, redis.call('PTTL', writer), 1}
end
local first = redis.call('ZRANGE', waiting, 0, 0, 'WITHSCORES')
if first[2] then
  return {0, tonumber(first[2]) - now, 3}
end
return admit()
";
    Script::new(&format!("{PRELUDE}{read}"))
});

/// A writer's attempt. ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] the
/// waiting mark's lifetime in ms (0: a one-shot try, which never marks),
/// ARGV[4] the fence counter's retention in ms.
///
/// Admitted when no writer holds, no reader is live, and no other writer
/// waits ahead of it (the oldest live mark is its own, or there is none):
/// `SET writer token PX ttl`, its mark removed, and the next fence
/// `max(last + 1, now µs)` as for a plain lock. Otherwise a waiting writer
/// marks itself (or refreshes its mark), which turns new readers away.
/// Returns `{1, fence, 0}`, or `{0, ms to wait, blocker}` with blocker 1
/// (the writer), 2 (the readers, until the earliest expires) or 3 (an
/// older waiting writer, until its mark expires). A writer that already
/// holds with this token (a resent attempt) is admitted again with the
/// fence issued then.
pub(super) static ACQUIRE_WRITE: LazyLock<Script> = LazyLock::new(|| {
    let write = r"
local token, ttl, mark_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local retention = tonumber(ARGV[4])
local function next_fence()
  local last = tonumber(redis.call('GET', counter))
  local fence = now_us
  if last and last >= now_us then
    fence = last + 1
  end
  redis.call('SET', counter, fence, 'PX', math.max(retention, ttl))
  return fence
end
local function wait(ms, blocker)
  if mark_ms > 0 then
    mark(token, mark_ms)
  end
  return {0, ms, blocker}
end
local holder = redis.call('GET', writer)
if holder == token then
  redis.call('PEXPIRE', writer, ttl)
  unmark(token)
  return {1, tonumber(redis.call('GET', counter)) or next_fence(), 0}
end
if holder then
  return wait(redis.call('PTTL', writer), 1)
end
local first = redis.call('ZRANGE', readers, 0, 0, 'WITHSCORES')
if first[2] then
  return wait(tonumber(first[2]) - now, 2)
end
local ahead, until_ms = oldest()
if ahead and ahead ~= token then
  return wait(until_ms - now, 3)
end
redis.call('SET', writer, token, 'PX', ttl)
unmark(token)
return {1, next_fence(), 0}
";
    Script::new(&format!("{PRELUDE}{write}"))
});

/// A reader's release. ARGV[1] token, ARGV[2] the release channel.
///
/// Removes the token; once no live reader is left, announces it (only a
/// writer waits for readers, and only for all of them). Returns 1 if the
/// lease was still live (ours), 0 otherwise.
pub(super) static RELEASE_READ: LazyLock<Script> = LazyLock::new(|| {
    let release = r"
local score = redis.call('ZSCORE', readers, ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', readers, ARGV[1])
if redis.call('EXISTS', readers) == 0 then
  redis.pcall('PUBLISH', ARGV[2], 'read')
end
return 1
";
    Script::new(&format!("{PRELUDE}{release}"))
});

/// A writer's release: compare-and-`DEL` of the writer key, then announce
/// it. ARGV[1] token, ARGV[2] the release channel. Returns 1 if it was
/// ours, 0 otherwise.
pub(super) static RELEASE_WRITE: LazyLock<Script> = LazyLock::new(|| {
    let release = r"
if redis.call('GET', writer) ~= ARGV[1] then
  return 0
end
redis.call('DEL', writer)
redis.pcall('PUBLISH', ARGV[2], 'write')
return 1
";
    Script::new(&format!("{PRELUDE}{release}"))
});

/// Everything a token may have left behind when its acquisition was given
/// up (a dropped future, a failed request, a wait that ran out): its
/// reader entry, its writer key, its waiting mark. Announces the change if
/// there was one, so readers a mark held back come in at once. ARGV[1]
/// token, ARGV[2] the release channel. Returns how many were removed.
pub(super) static ABANDON: LazyLock<Script> = LazyLock::new(|| {
    let abandon = r"
local token = ARGV[1]
local removed = redis.call('ZREM', readers, token) + redis.call('ZREM', waiting, token)
redis.call('ZREM', order, token)
if redis.call('GET', writer) == token then
  redis.call('DEL', writer)
  removed = removed + 1
end
if removed > 0 then
  redis.pcall('PUBLISH', ARGV[2], 'abandon')
end
return removed
";
    Script::new(&format!("{PRELUDE}{abandon}"))
});
