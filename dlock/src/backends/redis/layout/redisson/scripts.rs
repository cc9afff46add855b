//! The Lua scripts of Redisson's layout: dlock's own, written to the
//! behaviour of Redisson 4.7.0's `RedissonLock` (`tryLockInnerAsync`,
//! `unlockInnerAsync`, `forceUnlockAsync`), its watchdog (`LockTask`) and
//! `RedissonFencedLock`, so that both take part in one lock.
//!
//! What dlock leaves out: Redisson's unlock latch
//! (`redisson_unlock_latch:{<name>}:<request id>`, which makes a *retried*
//! unlock answer as the first did). A dlock release that lost its answer is
//! not sent again; the lease is then released or it expires.

use std::sync::LazyLock;

use redis::Script;

/// Takes the lock. KEYS: the hash, then (when in its slot) the fence
/// counter. ARGV: the lease in ms, the holder's field, dlock's own key of
/// the name (`''` when it lives in another Cluster slot).
///
/// As Redisson's: free (no hash) or already this holder's → the field and
/// the expiry are set; else the holder's `PTTL` comes back. Apart from
/// Redisson, a dlock holder counts once (a resent attempt does not make it
/// reentrant: dlock's reentrancy is its guard's scope), the fence is
/// `RFencedLock`'s counter, incremented on a new grant only, and a name
/// that dlock's layout holds is not free (its time left, at most 200 ms,
/// comes back: that release does not wake this waiter; see `layouts.rs`).
/// Answers `{1, fence}` (fence 0: no counter named) or `{0, pttl}`.
pub(super) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local again = redis.call('hexists', KEYS[1], ARGV[2]) == 1
if not again and ARGV[3] ~= '' and redis.call('exists', ARGV[3]) == 1 then
  local left = redis.call('pttl', ARGV[3])
  if left < 0 or left > 200 then left = 200 end
  return {0, left}
end
if again or redis.call('exists', KEYS[1]) == 0 then
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  local fence = 0
  if #KEYS > 1 then
    if again then
      fence = tonumber(redis.call('get', KEYS[2]) or '0')
    else
      fence = redis.call('incr', KEYS[2])
    end
  end
  return {1, fence}
end
return {0, redis.call('pttl', KEYS[1])}
",
    )
});

/// Extends the lease while the holder's field is in the hash (Redisson's
/// watchdog check). KEYS: the hash. ARGV: the lease in ms, the field.
/// Answers 1 renewed, -1 held by another, 0 gone.
pub(super) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
if redis.call('exists', KEYS[1]) == 1 then return -1 end
return 0
",
    )
});

/// Gives one hold back. KEYS: the hash, then (sharded) Java's channel.
/// ARGV: the field, the lease in ms, `1` to `SPUBLISH` on KEYS[2], then the
/// channels to `PUBLISH` on. As Redisson's unlock: not the holder → 0;
/// the count down by one, still above zero → expiry renewed; at zero the
/// hash is deleted and the unlock message (`0`) published. Answers 1 when
/// the hold was this holder's.
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
redis.call('del', KEYS[1])
for i = 4, #ARGV do redis.call('publish', ARGV[i], '0') end
if ARGV[3] == '1' then redis.call('spublish', KEYS[2], '0') end
return 1
",
    )
});

/// Deletes the hash whoever holds it, and announces it as Redisson's
/// `forceUnlock` does. KEYS and ARGV[1..] as [`RELEASE`]'s from its third
/// argument on: `1` to `SPUBLISH`, then the channels. Answers 1 when a
/// holder was removed.
pub(super) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('del', KEYS[1]) == 0 then return 0 end
for i = 2, #ARGV do redis.call('publish', ARGV[i], '0') end
if ARGV[1] == '1' then redis.call('spublish', KEYS[2], '0') end
return 1
",
    )
});

/// Who holds the lock. KEYS: the hash, then (when in its slot) the fence
/// counter. Answers `{0, '', -2, ''}` (free, or not a hash), or `{1, first field,
/// pttl, fence or ''}`.
pub(super) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('type', KEYS[1])['ok'] ~= 'hash' then return {0, '', -2, ''} end
local fields = redis.call('hkeys', KEYS[1])
local fence = ''
if #KEYS > 1 then fence = redis.call('get', KEYS[2]) or '' end
return {1, fields[1] or '', redis.call('pttl', KEYS[1]), fence}
",
    )
});
