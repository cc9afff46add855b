//! Renewal scripts that renew many leases in one call, and the cutting of a
//! renewal round into such calls.
//!
//! Why: a script call has a fixed cost on Redis's one thread (parsing, the
//! script's set-up, the reply) several times that of the `GET` + `PEXPIRE`
//! it runs for one lease. One call per held lease made renewal the main
//! load of a server holding many locks (0.97 calls per held lock per second
//! at ttl 3 s, 57 % of a core at 200,000 locks). One call now renews up to
//! [`LEASES_PER_CALL`] leases, each checked on its own (a lost lease is
//! refused, the others are renewed), as Redisson renews up to 100 per script.
//!
//! On a Cluster, one call's keys must share a hash slot: leases are grouped
//! by slot first, so a call there renews the leases that share one.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::cluster_routing::Slot;
use redis::Script;

/// The most leases one script call renews: big enough that the call's own
/// cost is small beside its leases', small enough that one call holds
/// Redis's thread for well under a millisecond.
pub(in crate::backends::redis) const LEASES_PER_CALL: usize = 100;

/// Compare-and-`PEXPIRE` of each key: `KEYS[i]`'s value must be
/// `ARGV[2i-1]` (the token) for its expiry to become `ARGV[2i]` ms.
/// Answers one 1 (renewed) or 0 (not ours) per key, in order. The values
/// are read with one `MGET`: each `redis.call` from a script costs about a
/// microsecond of its own, as much as the `GET` it runs. The script runs
/// atomically, so no key changes between the read and its `PEXPIRE`.
pub(in crate::backends::redis) static RENEW_KEYS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local owners = redis.call('MGET', unpack(KEYS))
local renewed = {}
for i = 1, #KEYS do
  if owners[i] == ARGV[2 * i - 1] then
    renewed[i] = redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  else
    renewed[i] = 0
  end
end
return renewed
",
    )
});

/// Compare-and-extend of each member: the token `ARGV[2i-1]` must be a live
/// member of the sorted set `KEYS[i]` (scored by its expiry) for its score
/// to become now + `ARGV[2i]` ms; the set lives at least as long. Answers
/// one 1 or 0 per member, in order (permits, and readers of a read-write
/// lock).
pub(in crate::backends::redis) static RENEW_MEMBERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local renewed = {}
for i = 1, #KEYS do
  local token, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local score = redis.call('ZSCORE', KEYS[i], token)
  if score and tonumber(score) > now then
    local expires = now + ttl
    redis.call('ZADD', KEYS[i], 'XX', expires, token)
    if redis.call('PTTL', KEYS[i]) < ttl then
      redis.call('PEXPIREAT', KEYS[i], expires)
    end
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
",
    )
});

/// Cuts leases (by index, each with its key) into calls of at most
/// [`LEASES_PER_CALL`]; with `by_slot` (a Cluster), the leases of one call
/// share a hash slot. Every index is in exactly one call.
pub(in crate::backends::redis) fn calls(keys: &[String], by_slot: bool) -> Vec<Vec<usize>> {
    if !by_slot {
        let all: Vec<usize> = (0..keys.len()).collect();
        return all.chunks(LEASES_PER_CALL).map(<[usize]>::to_vec).collect();
    }
    let mut slots: HashMap<Slot, Vec<usize>> = HashMap::new();
    let mut order = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key.as_bytes());
        slots
            .entry(slot)
            .or_insert_with(|| {
                order.push(slot);
                Vec::new()
            })
            .push(i);
    }
    order
        .iter()
        .flat_map(|slot| {
            slots[slot]
                .chunks(LEASES_PER_CALL)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lease_is_in_one_call_within_the_bound() {
        let keys: Vec<String> = (0..1234)
            .map(|i| format!("dlock:{{k{}}}", i % 300))
            .collect();
        for by_slot in [false, true] {
            let calls = calls(&keys, by_slot);
            let mut seen: Vec<usize> = calls.iter().flatten().copied().collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..keys.len()).collect::<Vec<_>>());
            assert!(calls
                .iter()
                .all(|c| !c.is_empty() && c.len() <= LEASES_PER_CALL));
            if by_slot {
                for call in &calls {
                    let slot = Slot::for_key(keys[call[0]].as_bytes());
                    assert!(call
                        .iter()
                        .all(|&i| Slot::for_key(keys[i].as_bytes()) == slot));
                }
            }
        }
        assert_eq!(calls(&keys, false).len(), 13);
        assert!(calls(&[], true).is_empty());
    }
}
