//! Double barriers on Redis: a sorted set of member tokens scored by
//! expiry, and an announcement channel.
//!
//! Keys: `<prefix>:{<name>}:barrier` is the sorted set (member = member
//! token, score = expiry in ms on the server's clock); every arrival that
//! opens the barrier and every departure is announced on
//! `<prefix>:{<name>}:barrier:changed`. They share the name's hash tag, so
//! one script reaches them in a cluster, and differ from a lock's and a
//! semaphore's names.
//!
//! - The barrier is open while the set holds the member `open` (score -1:
//!   expiries are positive, so it never counts as a member nor expires as
//!   one). The arrival of the `parties`-th live member adds it; it goes
//!   with the set once no live member is left (the last to leave, or the
//!   first script to find every member expired: a member whose process
//!   died is counted out at its expiry, as a lock key's holder is).
//! - `enter` adds (or refreshes) its token and passes if the barrier is
//!   open; else it waits for an announcement or the earliest member's
//!   expiry, and looks again, refreshing its own expiry every third of its
//!   ttl (the watchdog takes over once it is in).
//! - `leave` removes its token (announced), then waits until no live
//!   member is left, woken by the announcements and expiries.
//! - A timed-out or dropped `enter` removes its token (`ReleaseIfDropped`).
//! - Every score comes from `TIME`, the server's clock, as for semaphores;
//!   the scripts use only the commands of the minimal ACL rule (no `ZCOUNT`:
//!   `ZCARD` less the `open` member).

use std::sync::atomic::AtomicBool;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::Script;

use crate::backend::{lease_deadline, BarrierBackend, BarrierRequest, Lease, Renewal};
use crate::backends::redis::calls::unfinished::ReleaseIfDropped;
use crate::backends::redis::protocol::scripts::{db_channel, evalsha, millis, KeyNames};
use crate::backends::redis::{check_ttl, Attempt, RedisBackend};
use crate::LockError;

/// Trim expired members (closing the barrier if none is left), add or
/// refresh the token, and open the barrier at `parties` live members:
/// `{1, 0}` (in, the barrier open) or `{0, ms until the earliest expiry}`.
///
/// KEYS[1] the set; ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] parties,
/// ARGV[4] the channel.
static ENTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local function live()
  local n = redis.call('ZCARD', KEYS[1])
  if redis.call('ZSCORE', KEYS[1], 'open') then
    n = n - 1
  end
  return n
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(0', now)
if live() == 0 then
  redis.call('DEL', KEYS[1])
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local live = live()
local open = redis.call('ZSCORE', KEYS[1], 'open')
if not open and live >= tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], -1, 'open')
  redis.pcall('PUBLISH', ARGV[4], 'open')
  open = true
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
if open then
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], '(0', '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
return {0, tonumber(first[2]) - now}
",
    )
});

/// Remove the token and announce it; the set goes once no live member is
/// left. Returns 1 only if the member was still live (ours).
///
/// KEYS[1] the set; ARGV[1] token, ARGV[2] the channel.
static REMOVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local function live()
  local n = redis.call('ZCARD', KEYS[1])
  if redis.call('ZSCORE', KEYS[1], 'open') then
    n = n - 1
  end
  return n
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(0', now)
if live() == 0 then
  redis.call('DEL', KEYS[1])
end
redis.pcall('PUBLISH', ARGV[2], 'left')
if tonumber(score) > now then
  return 1
end
return 0
",
    )
});

/// Trim expired members and count the live ones (closing the barrier at
/// none): `{live, ms until the earliest expiry}`.
///
/// KEYS[1] the set.
static COUNT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local function live()
  local n = redis.call('ZCARD', KEYS[1])
  if redis.call('ZSCORE', KEYS[1], 'open') then
    n = n - 1
  end
  return n
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(0', now)
local live = live()
if live == 0 then
  redis.call('DEL', KEYS[1])
  return {0, 0}
end
local first = redis.call('ZRANGE', KEYS[1], '(0', '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
return {live, tonumber(first[2]) - now}
",
    )
});

/// Extend a live member's expiry: 1, or 0 if it is gone or expired.
///
/// KEYS[1] the set; ARGV[1] token, ARGV[2] ttl in ms.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return 1
",
    )
});

/// The Redis names of one barrier.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BarrierNames {
    set: String,
    channel: String,
}

impl BarrierNames {
    fn new(prefix: &str, name: &str, db: i64) -> Self {
        let base = KeyNames::new(prefix, name).lock;
        let mut channel = format!("{base}:barrier:changed");
        db_channel(&mut channel, db);
        BarrierNames {
            set: format!("{base}:barrier"),
            channel,
        }
    }
}

impl RedisBackend {
    fn barrier_names(&self, name: &str) -> BarrierNames {
        BarrierNames::new(&self.options.prefix, name, self.db)
    }

    /// One run of the enter script: in (a lease), or how long until the
    /// earliest member's expiry, capped at a third of our ttl so our own
    /// expiry is refreshed while we wait.
    async fn attempt_enter(
        &self,
        req: &BarrierRequest,
        names: &BarrierNames,
    ) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        let mut call = evalsha(&ENTER, 1);
        call.arg(&names.set)
            .arg(&req.token)
            .arg(millis(req.ttl))
            .arg(req.parties)
            .arg(&names.channel);
        let (open, left): (i64, i64) = self.eval(&ENTER, &call).await?;
        if open == 1 {
            let valid_until = lease_deadline(sent, req.ttl);
            let lease = Lease::unfenced(
                &req.name,
                &req.token,
                req.ttl,
                valid_until,
                names.set.clone(),
            );
            return Ok(Attempt::Acquired(lease));
        }
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
        Ok(Attempt::Held(Some(left.min(req.ttl / 3))))
    }

    async fn remove_member_now(&self, lease: &Lease) -> Result<bool, LockError> {
        let names = self.barrier_names(&lease.key);
        let mut call = evalsha(&REMOVE, 1);
        call.arg(&names.set).arg(&lease.token).arg(&names.channel);
        let removed: i64 = self.eval(&REMOVE, &call).await?;
        Ok(removed == 1)
    }

    /// No live member left: done (the member's lease stands for "done"),
    /// or how long until the earliest expiry.
    async fn attempt_all_left(
        &self,
        member: &Lease,
        names: &BarrierNames,
    ) -> Result<Attempt, LockError> {
        let mut call = evalsha(&COUNT, 1);
        call.arg(&names.set);
        let (live, left): (i64, i64) = self.eval(&COUNT, &call).await?;
        if live == 0 {
            return Ok(Attempt::Acquired(member.clone()));
        }
        Ok(Attempt::Held(Some(Duration::from_millis(
            u64::try_from(left).unwrap_or(0),
        ))))
    }
}

#[async_trait]
impl BarrierBackend for RedisBackend {
    async fn enter_barrier(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.name, &self.options.shown)?;
        let names = self.barrier_names(&req.name);
        // Our token is in the set from the first try: any end but entering
        // (a deadline, an error, a drop) takes it out.
        let mut member =
            ReleaseIfDropped::arm(&self.conn, &REMOVE, &names.set, &req.token, &names.channel);
        let heard = AtomicBool::new(false);
        let entered = self
            .wait_for_release(&names.channel, None, None, deadline, req.ttl, |_| {
                self.within(
                    deadline,
                    self.attempt_enter(req, &names),
                    Attempt::Held(Some(Duration::ZERO)),
                    &heard,
                )
            })
            .await?;
        match &entered {
            Some(_) => member.disarm(),
            // Out of time: out of the set before the caller hears so, so a
            // member that enters next does not count this one.
            None => {
                let ours = Lease::unfenced(
                    &req.name,
                    &req.token,
                    req.ttl,
                    Instant::now(),
                    String::new(),
                );
                if self.remove_member_now(&ours).await.is_ok() {
                    member.disarm();
                }
            }
        }
        Ok(entered)
    }

    async fn wait_all_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        let names = self.barrier_names(&member.key);
        let heard = AtomicBool::new(false);
        let gone = self
            .wait_for_release(&names.channel, None, None, deadline, member.ttl, |_| {
                self.within(
                    deadline,
                    self.attempt_all_left(member, &names),
                    Attempt::Held(Some(Duration::ZERO)),
                    &heard,
                )
            })
            .await?;
        Ok(gone.is_some())
    }

    async fn renew_members(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let mut answers = Vec::with_capacity(leases.len());
        for lease in leases {
            let sent = Instant::now();
            let names = self.barrier_names(&lease.key);
            let mut call = evalsha(&RENEW, 1);
            call.arg(&names.set)
                .arg(&lease.token)
                .arg(millis(lease.ttl));
            let answer: Result<i64, LockError> = self.eval(&RENEW, &call).await;
            answers.push(answer.map(|renewed| {
                if renewed == 1 {
                    Renewal::Renewed {
                        valid_until: lease_deadline(sent, lease.ttl),
                    }
                } else {
                    Renewal::Deleted
                }
            }));
        }
        answers
    }

    async fn remove_member(&self, lease: &Lease) -> Result<bool, LockError> {
        self.remove_member_now(lease).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_name_hash_tag_but_not_its_other_keys() {
        let n = BarrierNames::new("dlock", "batch", 0);
        assert_eq!(n.set, "dlock:{batch}:barrier");
        assert_eq!(n.channel, "dlock:{batch}:barrier:changed");
        let lock = KeyNames::new("dlock", "batch");
        assert!(![&lock.lock, &lock.fence, &lock.channel].contains(&&n.set));
    }
}
