//! Semaphores on Redis: a sorted set of permit tokens scored by expiry.
//!
//! Keys: `<prefix>:{<name>}:permits` is the sorted set (member = permit
//! token, score = expiry in ms on the server's clock), and releases are
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

use crate::backend::refusal::About;
use crate::backend::{
    lease_deadline, permit_count_differs, Lease, PermitBackend, PermitRequest, Renewal,
};
use crate::backends::redis::calls::unfinished::ReleaseIfDropped;
use crate::backends::redis::protocol::scripts::{db_channel, evalsha, millis, KeyNames};
use crate::backends::redis::{check_ttl, Attempt, RedisBackend};
use crate::LockError;

/// Trim expired members, count, and add the token if fewer than `permits`
/// are held: returns `{1, 0}`, `{0, ms until the earliest expiry}`, or
/// `{2, stored count}` when live permits were taken with another count.
/// The set itself expires with its last permit, so an abandoned semaphore
/// leaves nothing behind.
///
/// KEYS[1] the set; ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] permits.
pub(in crate::backends::redis) static ACQUIRE_PERMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local permits = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(0', now)
local stored = redis.call('ZSCORE', KEYS[1], 'permits')
local held = redis.call('ZCARD', KEYS[1])
if stored then
  stored = -tonumber(stored)
  held = held - 1
  if held > 0 and stored ~= permits then
    return {2, stored}
  end
end
if held < permits then
  local expires = now + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], expires, ARGV[1], -permits, 'permits')
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], '(0', '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
return {0, tonumber(first[2]) - now}
",
    )
});

/// Remove the token; if it was there, announce the free permit. Returns 1
/// only if the permit was still live (ours). Once no live permit is left,
/// the set goes, with the count it held.
///
/// KEYS[1] the set; ARGV[1] token, ARGV[2] the release channel.
pub(in crate::backends::redis) static RELEASE_PERMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(0', now)
if redis.call('ZCARD', KEYS[1]) <= 1 and redis.call('ZSCORE', KEYS[1], 'permits') then
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

/// The Redis names of one semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::backends::redis) struct PermitNames {
    pub(in crate::backends::redis) set: String,
    pub(in crate::backends::redis) channel: String,
}

impl PermitNames {
    pub(in crate::backends::redis) fn new(prefix: &str, name: &str) -> Self {
        let base = KeyNames::new(prefix, name).lock;
        PermitNames {
            set: format!("{base}:permits"),
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
    /// One run of the acquire script.
    pub(in crate::backends::redis) async fn attempt_permit(
        &self,
        req: &PermitRequest,
        names: &PermitNames,
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
        let mut call = evalsha(&ACQUIRE_PERMIT, 1);
        call.arg(&names.set)
            .arg(&req.token)
            .arg(millis(req.ttl))
            .arg(req.permits);
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
    /// Every waiter of the semaphore hears every release and one of them
    /// wins it; the local gate keeps this to at most `permits` waiters per
    /// process.
    pub(in crate::backends::redis) async fn wait_for_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let names = PermitNames::new(&self.options.prefix, &req.name).in_db(self.db);
        // Whether a try of this wait was answered (see `within`).
        let heard = std::sync::atomic::AtomicBool::new(false);
        // No re-check: a semaphore's waiters wake on releases and expiries.
        self.wait_for_release(&names.channel, None, None, deadline, req.ttl, |_| {
            self.within(
                deadline,
                self.attempt_permit(req, &names),
                Attempt::Held(Some(Duration::ZERO)),
                &heard,
            )
        })
        .await
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
            Ok(match self.attempt_permit(req, &names).await? {
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
