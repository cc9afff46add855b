//! The Lua of the waiting queue (see `waiter_queue.rs` for the protocol):
//! its one liveness rule, which the plain acquire shares, and the functions
//! the release, the queued acquire, the leave and the heartbeat are made
//! of. Text only, beneath every script that embeds it.

use std::time::Duration;

/// How often a backend's heartbeat proves its queued tickets alive (see
/// `turns.rs`): each beat keeps them for a second (`LIFE_MS` in
/// [`QUEUE_FUNCTIONS`], the longest a dead or stopped waiter can hold up
/// the waiters behind it), so a live waiter whose process is late by up to
/// two heartbeats keeps its place.
pub(crate) const HEARTBEAT: Duration = Duration::from_millis(300);

/// The Lua of the queue's one liveness rule, shared by the plain acquire
/// (`scripts.rs`) and the queue's own functions (`waiter_queue.rs`), so the two
/// cannot drift apart: `LIFE_MS`, how long a ticket lives after it last
/// proved it, and `first_live(lock, me, now_ms)`, the first ticket of the
/// key's queue that is `me` or alive (until its time, never more than
/// `LIFE_MS` ahead: a forged entry or a step back of the server's clock
/// counts as gone), dropping the dead ones ahead of it; nil if none.
macro_rules! queue_liveness_lua {
    () => {
        r"
local LIFE_MS = 1000
local function first_live(lock, me, now_ms)
  local queue, waiters = lock .. ':queue', lock .. ':waiters'
  while true do
    local first = redis.call('ZRANGE', queue, 0, 0)[1]
    if not first or first == me then
      return first
    end
    local gone_at = tonumber(redis.call('ZSCORE', waiters, first))
    if gone_at and gone_at > now_ms and gone_at <= now_ms + LIFE_MS then
      return first
    end
    redis.call('ZREM', queue, first)
    redis.call('ZREM', waiters, first)
  end
end
"
    };
}
pub(crate) use queue_liveness_lua;

/// The Lua of the queue, shared by the scripts that release a lock key and
/// by the queued acquire. The lock key's queue keys are named from the key
/// itself (same hash tag, so the same cluster slot; an ACL key pattern
/// `~<prefix>:*` covers them).
///
/// - `head_of(lock, me)`: the first live ticket, dropping dead ones on the
///   way (`me`, the ticket asking, is live: it is not looked up).
/// - `wake(ticket, channel)`: wakes only that ticket's waiter, on the
///   channel the ticket names (`<hash>@<channel>`), else on `channel`.
/// - `vacate(lock, channel)`: frees a key whose holder ended: deleted, and
///   the head woken (with the hand-off recorded for its gap, and the key's
///   run of hand-offs in `:share`, see `waiter_queue.rs`), or the
///   listeners told (`1`) if only they wait; `vacate_waited` is the same
///   for a caller that found `:waiters` already.
/// - `handoff_of(lock)`: the hand-off record (time, last hold, whether it
///   leaves a gap, the record), or nil; a time ahead of the server's clock
///   is none. `handing_off(lock)`: a hand-off under way (within the cap).
/// - `gap_left(lock, share)`: how long a head still leaves the key to
///   others after a hand-off.
/// - `foreign_took(lock, ticket)`: the key handed to `ticket` is held by
///   somebody else: a client that does not queue, now given its share.
/// - `met_holder(lock, holder)`: a waiter found the key held by `holder`;
///   a value not shaped as dlock's owner tokens (32 hex digits, `@`, the
///   client name) is a client that does not queue, now given its share.
/// - `wait_in_line(lock, who, queued, life)`: keeps `who` waiting for
///   `life` ms more (a ticket also joins the queue, keeping its place).
/// - `leave_line(lock, ticket)`: takes a ticket out of both sets.
/// - `life_for(left, ttl)`: how long a listener that will sleep `left` ms
///   (the holder's time; `ttl` if unknown) counts as alive. Listeners
///   re-register at each try rather than beat.
pub(crate) const QUEUE_FUNCTIONS: &str = concat!(
    queue_liveness_lua!(),
    r"
local GAP_CAP_MS = 100
local PROBE_EVERY_MS = 1000
local HOT_REST_MS = 1000
local HANDOFF_KEPT_MS = 1000
local FOREIGN_FOR_MS = 30000
local queue_clock_us
local function now_us()
  if not queue_clock_us then
    local t = redis.call('TIME')
    queue_clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return queue_clock_us
end
local function now_ms()
  return math.floor(now_us() / 1000)
end
local function leave_line(lock, ticket)
  redis.call('ZREM', lock .. ':queue', ticket)
  redis.call('ZREM', lock .. ':waiters', ticket)
end
local function head_of(lock, me)
  return first_live(lock, me, now_ms())
end
local function wake(ticket, channel)
  local own = string.match(ticket, '@(.+)$')
  redis.pcall('PUBLISH', own or channel, 'turn:' .. ticket)
end
local function vacate_waited(lock, channel)
  local waiters = lock .. ':waiters'
  redis.call('DEL', lock)
  local head = head_of(lock)
  if head then
    -- A gap for clients that do not queue only where one was seen lately
    -- (`foreign`), or as a probe once a second on a key handed on for
    -- longer than a second (`hot <at>`: when its run of hand-offs began, or
    -- its last probe); a key handed on now and then leaves none. The
    -- last hold's length sizes the gap and how long the run outlives this
    -- hand-off: a hold about as long again, and `HOT_REST_MS` more.
    local held = 0
    local granted = tonumber(redis.call('GET', lock .. ':fence'))
    if granted and granted < now_us() then
      held = math.floor((now_us() - granted) / 1000)
    end
    local seen = redis.call('GET', lock .. ':share')
    local shared = 0
    if seen == 'foreign' then
      shared = 1
    else
      local at = seen and tonumber(string.match(seen, '^hot (%d+)$'))
      if not at or at > now_ms() then
        at = now_ms()
      elseif now_ms() - at >= PROBE_EVERY_MS then
        shared = 1
        at = now_ms()
      end
      redis.call('SET', lock .. ':share', 'hot ' .. at, 'PX', held + HOT_REST_MS)
    end
    redis.call('SET', lock .. ':handoff', now_ms() .. ' ' .. held .. ' ' .. shared .. ' ' .. head, 'PX', HANDOFF_KEPT_MS)
    wake(head, channel)
    return
  end
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now_ms())
  if redis.call('EXISTS', waiters) == 1 then
    redis.pcall('PUBLISH', channel, '1')
  end
end
local function vacate(lock, channel)
  if redis.call('EXISTS', lock .. ':waiters') == 0 then
    redis.call('DEL', lock)
    return
  end
  vacate_waited(lock, channel)
end
local function handoff_of(lock)
  local handoff = redis.call('GET', lock .. ':handoff')
  if not handoff then
    return nil
  end
  local at, held, shared = string.match(handoff, '^(%d+) (%d+) ?(%d?)')
  -- A time ahead of the clock (a step back of the server's clock, a forged
  -- record) is no hand-off: nothing the server stored holds a queue back.
  if not at or tonumber(at) > now_ms() then
    return nil
  end
  return tonumber(at), tonumber(held), shared ~= '0', handoff
end
local function handing_off(lock)
  local at = handoff_of(lock)
  return at ~= nil and now_ms() - at < GAP_CAP_MS
end
local function gap_left(lock, share)
  if share <= 0 then
    return 0
  end
  local at, held, shared = handoff_of(lock)
  if not at or not shared then
    return 0
  end
  local gap = math.min(math.floor(held * share / (100 - share)), GAP_CAP_MS)
  return at + gap - now_ms()
end
local function foreign_took(lock, ticket)
  local at, _, _, handoff = handoff_of(lock)
  if at and string.sub(handoff, -(#ticket + 1)) == ' ' .. ticket then
    redis.call('SET', lock .. ':share', 'foreign', 'PX', FOREIGN_FOR_MS)
  end
end
local DLOCK_TOKEN = '^' .. string.rep('%x', 32) .. '@'
local function met_holder(lock, holder)
  if not string.find(holder, DLOCK_TOKEN) then
    redis.call('SET', lock .. ':share', 'foreign', 'PX', FOREIGN_FOR_MS)
  end
end
local function keep_for(key, life)
  if redis.call('PTTL', key) < life then
    redis.call('PEXPIRE', key, life + LIFE_MS)
  end
end
local function wait_in_line(lock, who, queued, life)
  local queue, waiters = lock .. ':queue', lock .. ':waiters'
  if queued then
    redis.call('ZADD', queue, 'NX', now_ms(), who)
    redis.call('PEXPIRE', queue, LIFE_MS)
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
"
);
