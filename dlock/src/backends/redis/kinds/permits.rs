//! Semaphores on Redis: a sorted set of permit tokens scored by expiry.
//!
//! Keys: `<prefix>:{<name>}:permits` is the sorted set (member = permit
//! token, score = expiry in ms on the server's clock; a holder of n > 1
//! permits also has the member `w:<token>` scored -n), `…:permits:queue`
//! and `…:permits:queue:alive` the line of waiters (by arrival, and by when
//! each stops counting; see [`ACQUIRE_PERMIT`]), and releases are
//! announced on `<prefix>:{<name>}:permits:released`. They share the hash tag
//! of the name, so one script reaches them in a cluster; the names differ
//! from a lock's (`<prefix>:{<name>}`, `…:fence`, `…:released`), so a lock and
//! a semaphore may share a name.
//!
//! The permit count: the set also holds the member `permits`, scored by
//! minus the count its first holder gave (expiries are positive, so the
//! count never counts as a permit nor expires as one). While a permit is
//! live, a caller asking another count is refused with both numbers
//! ([`permit_count_differs`]); with none live, the next holder's count
//! replaces it. The member lives in the set, so it expires with the set
//! (the set's expiry follows its latest permit, renewals included), and
//! the release of the last permit deletes the set.
//!
//! Clock: every score is computed inside the scripts from `TIME`, the
//! server's clock, so clients with skewed clocks agree on which permits have
//! expired, exactly as they agree on a lock key's `PX` expiry (also the
//! server's clock). The client keeps its own, earlier, local deadline from
//! when it sent the request ([`lease_deadline`]). A step of the server's
//! clock moves permit expiry as it moves key expiry.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::Script;

use async_trait::async_trait;

use crate::backend::holder::holder_of;
use crate::backend::refusal::About;
use crate::backend::{
    lease_deadline, permit_count_differs, Lease, PermitBackend, PermitHolder, PermitRequest,
    Renewal, SemaphoreInfo,
};
use crate::backends::redis::calls::unfinished::ReleaseIfDropped;
use crate::backends::redis::protocol::scripts::{db_channel, evalsha, millis, KeyNames};
use crate::backends::redis::{check_ttl, Attempt, RedisBackend};
use crate::LockError;

/// Trim expired members and gone waiters, weigh the live holders, and add
/// the token if `count` more fit and it is this caller's turn: returns
/// `{1, 0}`, `{0, ms until it is worth asking again}`, or `{2, stored
/// count}` when live permits were taken with another count. The set itself
/// expires with its last permit, so an abandoned semaphore leaves nothing
/// behind.
///
/// Weights: a holder of `count` > 1 has a second member `w:<token>` in the
/// set, scored by minus its count (like `permits`: never trimmed as an
/// expiry, gone with the set); a token without one holds 1. A token leaving
/// takes its `w:` member with it.
///
/// The queue (waiting callers only, `queued` = 1): KEYS[2] holds waiting
/// tokens by arrival, KEYS[3] the same tokens by when they stop counting
/// (each ask refreshes it to now + ttl, so a waiter that died leaves the
/// line after a ttl). Only the head of the line may take; a one-shot ask
/// (`queued` = 0) takes only when nobody waits. So a waiting taker of 4 is
/// not overtaken by a later taker of 1. A granted waiter leaves the line and
/// announces it when others wait (the next one may fit too).
///
/// KEYS[1] the set, KEYS[2] the line, KEYS[3] the line's liveness;
/// ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] permits, ARGV[4] count,
/// ARGV[5] queued (0/1), ARGV[6] the release channel.
pub(in crate::backends::redis) static ACQUIRE_PERMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token, ttl = ARGV[1], tonumber(ARGV[2])
local permits, count, queued = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
for _, gone in ipairs(redis.call('ZRANGE', KEYS[1], '(0', now, 'BYSCORE')) do
  redis.call('ZREM', KEYS[1], gone, 'w:' .. gone)
end
local live = redis.call('ZRANGE', KEYS[1], '(0', '+inf', 'BYSCORE')
local held = 0
for _, holder in ipairs(live) do
  local w = redis.call('ZSCORE', KEYS[1], 'w:' .. holder)
  if w then held = held - tonumber(w) else held = held + 1 end
end
local stored = redis.call('ZSCORE', KEYS[1], 'permits')
if stored then
  stored = -tonumber(stored)
  if #live > 0 and stored ~= permits then
    return {2, stored}
  end
end
for _, gone in ipairs(redis.call('ZRANGE', KEYS[3], '-inf', now, 'BYSCORE')) do
  redis.call('ZREM', KEYS[2], gone)
  redis.call('ZREM', KEYS[3], gone)
end
if queued then
  if not redis.call('ZSCORE', KEYS[2], token) then
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    local seq = 1
    if last[2] then seq = tonumber(last[2]) + 1 end
    redis.call('ZADD', KEYS[2], seq, token)
  end
  redis.call('ZADD', KEYS[3], now + ttl, token)
  local latest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[2], latest[2])
  redis.call('PEXPIREAT', KEYS[3], latest[2])
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
local my_turn = (head == nil) or (queued and head == token)
if my_turn and held + count <= permits then
  local expires = now + ttl
  redis.call('ZADD', KEYS[1], expires, token, -permits, 'permits')
  if count > 1 then
    redis.call('ZADD', KEYS[1], -count, 'w:' .. token)
  end
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
  if queued then
    redis.call('ZREM', KEYS[2], token)
    redis.call('ZREM', KEYS[3], token)
    if redis.call('ZCARD', KEYS[2]) > 0 then
      redis.pcall('PUBLISH', ARGV[6], '1')
    end
  end
  return {1, 0}
end
local again = ttl
if queued then again = math.max(1, math.floor(ttl / 3)) end
local first = redis.call('ZRANGE', KEYS[1], '(0', '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
if first[2] then again = math.min(again, tonumber(first[2]) - now) end
return {0, again}
",
    )
});

/// Remove the token as a holder (with its weight) and as a waiter; if it
/// was either, announce it. Returns 1 only if the permit was still live
/// (ours). Once no live permit is left, the set goes, with the count it
/// held. The line's keys are the set's name with `:queue` and
/// `:queue:alive` (the same hash tag, so the same slot): this script is
/// also what a dropped acquire runs (`unfinished.rs`), which passes one key.
///
/// KEYS[1] the set; ARGV[1] token, ARGV[2] the release channel.
pub(in crate::backends::redis) static RELEASE_PERMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local queue, alive = KEYS[1] .. ':queue', KEYS[1] .. ':queue:alive'
local waited = redis.call('ZREM', queue, ARGV[1])
redis.call('ZREM', alive, ARGV[1])
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  if waited == 1 then
    redis.pcall('PUBLISH', ARGV[2], '1')
  end
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1], 'w:' .. ARGV[1])
for _, gone in ipairs(redis.call('ZRANGE', KEYS[1], '(0', now, 'BYSCORE')) do
  redis.call('ZREM', KEYS[1], gone, 'w:' .. gone)
end
if #redis.call('ZRANGE', KEYS[1], '(0', '+inf', 'BYSCORE', 'LIMIT', 0, 1) == 0 then
  redis.call('DEL', KEYS[1])
end
redis.pcall('PUBLISH', ARGV[2], '1')
if tonumber(score) > now then
  return 1
end
return 0
",
    )
});

/// The live holders' weight, their number and the stored count (0 if
/// none), without writing.
///
/// KEYS[1] the set.
static AVAILABLE_PERMITS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE')
local held = 0
for _, holder in ipairs(live) do
  local w = redis.call('ZSCORE', KEYS[1], 'w:' .. holder)
  if w then held = held - tonumber(w) else held = held + 1 end
end
local stored = redis.call('ZSCORE', KEYS[1], 'permits')
if stored then stored = -tonumber(stored) else stored = 0 end
return {held, #live, stored}
",
    )
});

/// The live holders, each with its weight, and the stored count (0 if
/// none), without writing: `{stored, token, n, token, n, …}`.
///
/// KEYS[1] the set.
static INSPECT_PERMITS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE')
local stored = redis.call('ZSCORE', KEYS[1], 'permits')
local out = {0}
if stored then out[1] = -tonumber(stored) end
for _, holder in ipairs(live) do
  local w = redis.call('ZSCORE', KEYS[1], 'w:' .. holder)
  out[#out + 1] = holder
  if w then out[#out + 1] = -tonumber(w) else out[#out + 1] = 1 end
end
return out
",
    )
});

/// The Redis names of one semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::backends::redis) struct PermitNames {
    pub(in crate::backends::redis) set: String,
    /// Waiting tokens by arrival (see [`ACQUIRE_PERMIT`]).
    pub(in crate::backends::redis) queue: String,
    /// Waiting tokens by when they stop counting.
    pub(in crate::backends::redis) alive: String,
    pub(in crate::backends::redis) channel: String,
}

impl PermitNames {
    pub(in crate::backends::redis) fn new(prefix: &str, name: &str) -> Self {
        let base = KeyNames::new(prefix, name).lock;
        PermitNames {
            set: format!("{base}:permits"),
            queue: format!("{base}:permits:queue"),
            alive: format!("{base}:permits:queue:alive"),
            channel: format!("{base}:permits:released"),
        }
    }

    /// These names on database `db` (see [`db_channel`]).
    pub(in crate::backends::redis) fn in_db(mut self, db: i64) -> Self {
        db_channel(&mut self.channel, db);
        self
    }
}

impl RedisBackend {
    /// One run of the acquire script; `queued`: as a waiter, in line.
    pub(in crate::backends::redis) async fn attempt_permit(
        &self,
        req: &PermitRequest,
        names: &PermitNames,
        queued: bool,
    ) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        // A permit taken by a script whose caller went away is given back
        // (see `unfinished.rs`).
        let mut unfinished = ReleaseIfDropped::arm(
            &self.conn,
            &RELEASE_PERMIT,
            &names.set,
            &req.token,
            &names.channel,
        );
        let mut call = evalsha(&ACQUIRE_PERMIT, 3);
        call.arg(&names.set)
            .arg(&names.queue)
            .arg(&names.alive)
            .arg(&req.token)
            .arg(millis(req.ttl))
            .arg(req.permits)
            .arg(req.count)
            .arg(u8::from(queued))
            .arg(&names.channel);
        let (won, left): (i64, i64) = self.eval(&ACQUIRE_PERMIT, &call).await?;
        unfinished.disarm();
        if won == 2 {
            let stored = usize::try_from(left).unwrap_or(0);
            return Err(permit_count_differs(&req.name, stored, req.permits));
        }
        if won == 1 {
            let valid_until = lease_deadline(sent, req.ttl);
            let resource = names.set.clone();
            let lease = Lease::unfenced(&req.name, &req.token, req.ttl, valid_until, resource);
            return Ok(Attempt::Acquired(lease));
        }
        Ok(Attempt::Held(Some(Duration::from_millis(
            u64::try_from(left).unwrap_or(0),
        ))))
    }

    /// Waits for a permit (see `wait_for_release`); while the semaphore is
    /// full, the earliest permit's expiry is when to try again unannounced.
    ///
    /// Every waiter of the semaphore hears every release; only the head of
    /// the server's line may take (see [`ACQUIRE_PERMIT`]); the local gate
    /// keeps this to at most `permits` waiters per process. A wait that
    /// ends without a permit (timed out, failed, dropped) leaves the line
    /// through the release script, in the background, and wakes the next.
    pub(in crate::backends::redis) async fn wait_for_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let names = PermitNames::new(&self.options.prefix, &req.name).in_db(self.db);
        // Whether a try of this wait was answered (see `within`).
        let heard = std::sync::atomic::AtomicBool::new(false);
        let mut in_line = self.permit_if_dropped(&names, &req.token);
        // No re-check: a semaphore's waiters wake on releases and expiries.
        let answer = self
            .wait_for_release(&names.channel, None, None, deadline, req.ttl, |_| {
                self.within(
                    deadline,
                    self.attempt_permit(req, &names, true),
                    Attempt::Held(Some(Duration::ZERO)),
                    &heard,
                )
            })
            .await;
        if matches!(answer, Ok(Some(_))) {
            in_line.disarm();
        }
        answer
    }

    /// How many of `permits` are free (the `AVAILABLE_PERMITS` script).
    async fn available_now(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        let names = PermitNames::new(&self.options.prefix, name).in_db(self.db);
        let mut call = evalsha(&AVAILABLE_PERMITS, 1);
        call.arg(&names.set);
        let (held, live, stored): (i64, i64, i64) = self.eval(&AVAILABLE_PERMITS, &call).await?;
        let stored = usize::try_from(stored).unwrap_or(0);
        if live > 0 && stored != permits {
            return Err(permit_count_differs(name, stored, permits));
        }
        Ok(permits.saturating_sub(usize::try_from(held).unwrap_or(0)))
    }

    /// `inspect_semaphore`: the live holders (their client names from the
    /// tokens, a foreign token shown without one) and the stored count.
    async fn inspect_now(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let names = PermitNames::new(&self.options.prefix, name).in_db(self.db);
        let mut call = evalsha(&INSPECT_PERMITS, 1);
        call.arg(&names.set);
        let answer: Vec<redis::Value> = self.eval(&INSPECT_PERMITS, &call).await?;
        let number = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).ok();
        let stored = answer.first().and_then(number).unwrap_or(0);
        let holders: Vec<_> = answer
            .get(1..)
            .unwrap_or_default()
            .chunks_exact(2)
            .map(|pair| {
                let token: String = redis::from_redis_value(pair[0].clone()).unwrap_or_default();
                let count = number(&pair[1]).and_then(|n| usize::try_from(n).ok());
                PermitHolder::new(
                    holder_of(&token).map(str::to_owned),
                    None,
                    count.unwrap_or(1),
                )
            })
            .collect();
        let permits = usize::try_from(stored)
            .ok()
            .filter(|p| *p > 0 && !holders.is_empty());
        Ok(SemaphoreInfo::new(permits, holders))
    }

    /// A guard that gives the permit of `token` back if dropped armed.
    fn permit_if_dropped<'a>(
        &'a self,
        names: &'a PermitNames,
        token: &'a str,
    ) -> ReleaseIfDropped<'a> {
        ReleaseIfDropped::arm(
            &self.conn,
            &RELEASE_PERMIT,
            &names.set,
            token,
            &names.channel,
        )
    }

    /// Gives a permit back (the release script).
    pub(in crate::backends::redis) async fn release_permit_now(
        &self,
        lease: &Lease,
    ) -> Result<bool, LockError> {
        let names = PermitNames::new(&self.options.prefix, &lease.key).in_db(self.db);
        let mut call = evalsha(&RELEASE_PERMIT, 1);
        call.arg(&names.set).arg(&lease.token).arg(&names.channel);
        let released: i64 = self.eval(&RELEASE_PERMIT, &call).await?;
        Ok(released == 1)
    }
}

#[async_trait]
impl PermitBackend for RedisBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.name, &self.options.shown)?;
        let names = PermitNames::new(&self.options.prefix, &req.name).in_db(self.db);
        let ask = || async {
            Ok(match self.attempt_permit(req, &names, false).await? {
                Attempt::Acquired(lease) => Some(lease),
                Attempt::Held(_) | Attempt::Behind(_) => None,
            })
        };
        let undo = |granted: Option<Lease>| async move {
            if let Some(lease) = granted {
                let _ = self.release_permit_now(&lease).await;
            }
        };
        let arm = || self.permit_if_dropped(&names, &req.token);
        let answer = self
            .replicated(&req.name, (None, true), ask, arm, undo)
            .await;
        answer.map_err(|e| self.name_refusal(e, About::Semaphore(&req.name)))
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.name, &self.options.shown)?;
        let names = PermitNames::new(&self.options.prefix, &req.name).in_db(self.db);
        let undo = |granted: Option<Lease>| async move {
            if let Some(lease) = granted {
                let _ = self.release_permit_now(&lease).await;
            }
        };
        let arm = || self.permit_if_dropped(&names, &req.token);
        let ask = || self.wait_for_permit(req, deadline);
        let answer = self
            .replicated(&req.name, (deadline, false), ask, arm, undo)
            .await;
        answer.map_err(|e| self.name_refusal(e, About::Semaphore(&req.name)))
    }

    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let renewed = self.renew_permit_leases(leases).await;
        self.name_refusals(leases, renewed, About::Semaphore)
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        let answer = self.release_permit_now(lease).await;
        answer.map_err(|e| self.name_refusal(e, About::Semaphore(&lease.key)))
    }

    fn many_permits(&self) -> bool {
        true
    }

    async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        crate::backend::key::validate(name)?;
        let answer = self.available_now(name, permits).await;
        answer.map_err(|e| self.name_refusal(e, About::Semaphore(name)))
    }

    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        crate::backend::key::validate(name)?;
        let answer = self.inspect_now(name).await;
        answer.map_err(|e| self.name_refusal(e, About::Semaphore(name)))
    }

    async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let answer = self.names_ending(prefix, ":permits").await;
        answer.map_err(|e| self.name_list_refusal(e, prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_lock_names_hash_tag_but_not_its_keys() {
        let n = PermitNames::new("dlock", "exports");
        assert_eq!(n.set, "dlock:{exports}:permits");
        assert_eq!(n.channel, "dlock:{exports}:permits:released");
        let lock = KeyNames::new("dlock", "exports");
        assert!(![&lock.lock, &lock.fence, &lock.channel].contains(&&n.set));
    }
}
