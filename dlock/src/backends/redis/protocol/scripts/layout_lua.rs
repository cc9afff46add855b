//! The Lua of the other layout's lock (see `layouts.rs`): text only,
//! embedded in every acquire script of dlock's layout and in the check
//! after a grant.

/// The Lua that finds the Redisson lock named by a dlock key:
/// `other_layout_left(lock)` answers how long to wait before trying again
/// (the Redisson holder's time left, at most `OTHER_LAYOUT_RETRY_MS`) when
/// the lock of the same name in Redisson's layout is held, and nil when it
/// is not, when `lock` does not have dlock's default prefix, or when the
/// server cannot reach the Redisson key from this script (another Cluster
/// slot: `pcall`, and the caller checks after the grant, see
/// `layouts.rs`'s `needs_check_after_grant`). `redisson_left(name)` is the same for a
/// Redisson key by its own name.
macro_rules! other_layout_lua {
    () => {
        r"
local OTHER_LAYOUT_RETRY_MS = 200
local function redisson_left(name)
  local kind = redis.pcall('TYPE', name)
  if type(kind) ~= 'table' or kind.ok ~= 'hash' then
    return nil
  end
  local left = redis.call('PTTL', name)
  if left <= 0 or redis.call('HLEN', name) > 16 then
    return nil
  end
  for _, field in ipairs(redis.call('HKEYS', name)) do
    if string.find(field, '^%x+%-%x+%-%x+%-%x+%-%x+:') then
      return math.min(left, OTHER_LAYOUT_RETRY_MS)
    end
  end
  return nil
end
local function other_layout_left(lock)
  if string.sub(lock, 1, 7) ~= 'dlock:{' or string.byte(lock, -1) ~= 125 then
    return nil
  end
  local name = string.gsub(string.sub(lock, 8, -2), '%%(%x%x)', function(hex)
    return string.char(tonumber(hex, 16))
  end)
  return redisson_left(name)
end
"
    };
}
pub(crate) use other_layout_lua;
