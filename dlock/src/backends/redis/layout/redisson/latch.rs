//! Count-down latches in Redisson's layout: the latch `shards` is
//! Redisson's `RCountDownLatch` `shards`, so Java services and dlock count
//! down one count and wake one another's waiters.
//!
//! Matched against Redisson's `RedissonCountDownLatch` and
//! `CountDownLatchPubSub`: the count is the string key named as the latch
//! (no prefix), deleted when it reaches zero; the channel is
//! `redisson_countdownlatch__channel__{<name>}`; the messages are `1` (a
//! new count was set) and `0` (zero reached). The scripts are dlock's own
//! (`kinds/latch.rs`), with the effects of Redisson's.
//!
//! Not covered: a Cluster whose Redisson clients use sharded pub/sub
//! (`SPUBLISH`, Redisson's `shardedSubscriptionMode`): dlock publishes and
//! subscribes with `PUBLISH`/`SUBSCRIBE` only, so there a Java waiter does
//! not hear dlock's `0`, nor dlock's waiter Java's.

use std::time::Instant;

use async_trait::async_trait;

use super::RedissonBackend;
use crate::backend::LatchBackend;
use crate::backends::redis::kinds::latch::LatchNames;
use crate::LockError;

/// Redisson's names of the latch `name`.
fn redisson_names(name: &str) -> LatchNames {
    LatchNames {
        count: name.to_owned(),
        channel: format!("redisson_countdownlatch__channel__{{{name}}}"),
    }
}

#[async_trait]
impl LatchBackend for RedissonBackend {
    async fn try_set_count(&self, name: &str, count: u64) -> Result<bool, LockError> {
        self.redis.latch_try_set(&redisson_names(name), count).await
    }

    async fn count_down(&self, name: &str) -> Result<(), LockError> {
        self.redis.latch_count_down(&redisson_names(name)).await
    }

    async fn count(&self, name: &str) -> Result<u64, LockError> {
        self.redis.latch_count(&redisson_names(name)).await
    }

    async fn wait_zero(&self, name: &str, deadline: Option<Instant>) -> Result<bool, LockError> {
        self.redis
            .latch_wait_zero(&redisson_names(name), deadline)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_redisson() {
        let n = redisson_names("shards");
        assert_eq!(n.count, "shards");
        assert_eq!(n.channel, "redisson_countdownlatch__channel__{shards}");
    }
}
