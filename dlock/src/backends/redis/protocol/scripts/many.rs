//! The scripts over several lock keys at once: a batch of acquires or of
//! releases of different locks in one call (`ACQUIRE_MANY`,
//! `RELEASE_MANY`, what `calls/batching.rs` sends under load), and several
//! keys granted all together or not at all (`ACQUIRE_ALL`, a `MultiLock`).

use std::sync::LazyLock;

use redis::Script;

use super::queue_lua::QUEUE_FUNCTIONS;
use super::ACQUIRE_FUNCTIONS;

/// [`ACQUIRE`] for many keys in one call (see `batch.rs`): KEYS are lock and
/// fence pairs, ARGV token and ttl pairs, then the counters' retention in
/// ms; returns the flat list of each key's two answers.
pub(crate) static ACQUIRE_MANY: LazyLock<Script> = LazyLock::new(|| {
    let many = r"
local out = {}
for i = 1, #KEYS, 2 do
  out[i], out[i + 1] = acquire(KEYS[i], KEYS[i + 1], ARGV[i], ARGV[i + 1])
end
return out
";
    Script::new(&format!("{ACQUIRE_FUNCTIONS}{many}"))
});

/// A `MultiLock`'s keys all or none, on one server (see `all_keys.rs`):
/// KEYS are lock and fence pairs, ARGV each key's token, then each key's
/// ttl in ms, then the counters' retention in ms. If a
/// key is held under another token nothing is written and the answer is
/// `{0, index, pttl}` (the key's position from 0, its holder's time left;
/// 100 ms for a free key that the queue's head is about to take);
/// else every key is taken as [`ACQUIRE`] takes one: `{1, fence, …}`, a
/// fence per key. The first pass only reads, so a busy key costs no write
/// but the caller's registration as a listener of the key in its way (it
/// does not queue: see `waiter_queue.rs`), which makes the key's release
/// announce itself.
pub(crate) static ACQUIRE_ALL: LazyLock<Script> = LazyLock::new(|| {
    let all = r"
local n = #KEYS / 2
for i = 1, n do
  local holder = redis.call('GET', KEYS[2 * i - 1])
  local left
  if holder and holder ~= ARGV[i] then
    left = redis.call('PTTL', KEYS[2 * i - 1])
  elseif not holder and redis.call('EXISTS', KEYS[2 * i - 1] .. ':queue') == 1 and live_queue(KEYS[2 * i - 1]) then
    -- Free, but the queue's head takes it next: try again soon.
    left = 100
  elseif not holder then
    -- Held in Redisson's layout, or nil (see `layouts.rs`).
    left = other_layout_left(KEYS[2 * i - 1])
  end
  if left then
    wait_in_line(KEYS[2 * i - 1], 'listen:' .. ARGV[i], false, life_for(left, ARGV[n + i]))
    return {0, i - 1, left}
  end
end
local out = {1}
for i = 1, n do
  local _, fence = acquire(KEYS[2 * i - 1], KEYS[2 * i], ARGV[i], ARGV[n + i])
  out[i + 1] = fence
end
return out
";
    Script::new(&format!("{ACQUIRE_FUNCTIONS}{QUEUE_FUNCTIONS}{all}"))
});

/// [`RELEASE`] for many keys in one call: KEYS are lock keys, ARGV token and
/// channel pairs; returns one answer per key.
pub(crate) static RELEASE_MANY: LazyLock<Script> = LazyLock::new(|| {
    let many = r"
local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then
    vacate(KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";
    Script::new(&format!("{QUEUE_FUNCTIONS}{many}"))
});
