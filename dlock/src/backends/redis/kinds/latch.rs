//! Count-down latches on Redis, in the layout of Redisson's
//! `RCountDownLatch`: the count is a string key that exists only while the
//! count is live (deleted when it reaches zero), and every change is
//! announced on the latch's channel: `1` when a count is set, `0` when it
//! reaches zero.
//!
//! Names: dlock's layout keeps the count at `<prefix>:{<name>}:latch` and
//! announces on `<prefix>:{<name>}:latch:changed` (the name's hash tag: one
//! slot on a Cluster, within the ACL grant `~<prefix>:* &<prefix>:*`);
//! `?layout=redisson` uses Redisson's names (`layout/redisson/latch.rs`).
//!
//! The scripts are dlock's own, with Redisson's effects: `try_set_count`
//! sets the key only where none is; `count_down` takes one from a live
//! count, deletes the key at zero and publishes `0` then. Unlike
//! Redisson's `DECR`, a `count_down` on an unset latch writes nothing (no
//! key at −1 for a moment), and the scripts use only the commands of
//! dlock's ACL grant (`GET`, `SET`, `DEL`, `PUBLISH`).
//!
//! Waiting: a waiter reads the count; while it is live, it subscribes to
//! the channel on the backend's shared subscriber (one `SUBSCRIBE` per name
//! however many waiters the process has), reads again, and reads once more
//! after each message (or after a reconnect of the subscriber, which may
//! have missed one). No timer: a waiter that hears nothing waits until its
//! deadline.

use std::sync::LazyLock;
use std::time::Instant;

use async_trait::async_trait;
use redis::Script;

use crate::backend::LatchBackend;
use crate::backends::redis::protocol::scripts::{db_channel, evalsha, KeyNames};
use crate::backends::redis::RedisBackend;
use crate::LockError;

/// Sets the count where none is live: 1 (and `1` published), else 0.
/// Counts are whole numbers below 2^53, written with `%d` so a large one
/// is not turned into Lua's exponent notation.
///
/// KEYS[1] the count; ARGV[1] the channel, ARGV[2] the count.
static TRY_SET_COUNT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local live = tonumber(redis.call('GET', KEYS[1]) or '0')
if live and live > 0 then
  return 0
end
redis.call('SET', KEYS[1], string.format('%d', tonumber(ARGV[2])))
redis.pcall('PUBLISH', ARGV[1], '1')
return 1
",
    )
});

/// Takes one from a live count; at zero the key goes and `0` is published.
/// An unset latch (or a count some other writer left at zero or below) is
/// left as it is, but a count at or below zero is deleted, as Redisson's
/// script does. Returns the count after.
///
/// KEYS[1] the count; ARGV[1] the channel.
static COUNT_DOWN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
v = tonumber(v)
if not v or v <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
v = v - 1
if v == 0 then
  redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', ARGV[1], '0')
else
  redis.call('SET', KEYS[1], string.format('%d', v))
end
return v
",
    )
});

/// The Redis names of one latch: its count key and its channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::backends::redis) struct LatchNames {
    pub(in crate::backends::redis) count: String,
    pub(in crate::backends::redis) channel: String,
}

impl LatchNames {
    /// dlock's layout, in the namespace `prefix`, on database `db`.
    fn dlock(prefix: &str, name: &str, db: i64) -> Self {
        let base = KeyNames::new(prefix, name).lock;
        let mut channel = format!("{base}:latch:changed");
        db_channel(&mut channel, db);
        LatchNames {
            count: format!("{base}:latch"),
            channel,
        }
    }
}

impl RedisBackend {
    fn latch_names(&self, name: &str) -> LatchNames {
        LatchNames::dlock(&self.options.prefix, name, self.db)
    }

    pub(in crate::backends::redis) async fn latch_try_set(
        &self,
        names: &LatchNames,
        count: u64,
    ) -> Result<bool, LockError> {
        let mut call = evalsha(&TRY_SET_COUNT, 1);
        call.arg(&names.count).arg(&names.channel).arg(count);
        let set: i64 = self.eval(&TRY_SET_COUNT, &call).await?;
        Ok(set == 1)
    }

    pub(in crate::backends::redis) async fn latch_count_down(
        &self,
        names: &LatchNames,
    ) -> Result<(), LockError> {
        let mut call = evalsha(&COUNT_DOWN, 1);
        call.arg(&names.count).arg(&names.channel);
        let _left: i64 = self.eval(&COUNT_DOWN, &call).await?;
        Ok(())
    }

    /// The count as `GET` reads it (what Redisson's `getCount` reads): 0
    /// when unset, or when something other than a positive whole number is
    /// there.
    pub(in crate::backends::redis) async fn latch_count(
        &self,
        names: &LatchNames,
    ) -> Result<u64, LockError> {
        let mut get = redis::cmd("GET");
        get.arg(&names.count);
        let value: Option<String> = self.query(&get).await?;
        Ok(value
            .and_then(|v| v.trim().parse::<i64>().ok())
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or(0))
    }

    /// Waits until the count is zero (see the module docs): `Ok(false)`
    /// when `deadline` passed first. Cancel safe: the subscription is a
    /// share of the subscriber's channel, given back on drop.
    pub(in crate::backends::redis) async fn latch_wait_zero(
        &self,
        names: &LatchNames,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        // Most waits on a latch already at zero cost one read, no SUBSCRIBE.
        if self.latch_count(names).await? == 0 {
            return Ok(true);
        }
        let waited = crate::backend::deadline::until(deadline, async {
            let mut subscription = self
                .subscriber
                .subscribe(std::slice::from_ref(&names.channel), deadline)
                .await;
            loop {
                subscription.mark_seen();
                if self.latch_count(names).await? == 0 {
                    return Ok(());
                }
                subscription.changed().await;
            }
        })
        .await;
        match waited {
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }
}

#[async_trait]
impl LatchBackend for RedisBackend {
    async fn try_set_count(&self, name: &str, count: u64) -> Result<bool, LockError> {
        self.latch_try_set(&self.latch_names(name), count).await
    }

    async fn count_down(&self, name: &str) -> Result<(), LockError> {
        self.latch_count_down(&self.latch_names(name)).await
    }

    async fn count(&self, name: &str) -> Result<u64, LockError> {
        self.latch_count(&self.latch_names(name)).await
    }

    async fn wait_zero(&self, name: &str, deadline: Option<Instant>) -> Result<bool, LockError> {
        self.latch_wait_zero(&self.latch_names(name), deadline)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_lock_names_hash_tag_but_not_its_keys() {
        let n = LatchNames::dlock("dlock", "shards", 0);
        assert_eq!(n.count, "dlock:{shards}:latch");
        assert_eq!(n.channel, "dlock:{shards}:latch:changed");
        assert_eq!(
            LatchNames::dlock("dlock", "shards", 2).channel,
            "dlock:{shards}:latch:changed:db2"
        );
    }
}
