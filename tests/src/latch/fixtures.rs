//! What each fixture tells of a latch on its server.

use std::time::Duration;

use crate::fixtures::memory::MemoryFixture;
use crate::fixtures::redis::RedisFixture;
use crate::fixtures::redisson::RedissonFixture;

use super::LatchFixture;

#[async_trait::async_trait]
impl LatchFixture for MemoryFixture {
    async fn latch_subscriptions(&self, _name: &str) -> Option<usize> {
        None
    }

    async fn latch_state(&self, _name: &str) -> Vec<String> {
        // One fixture per case: every latch it keeps is this case's.
        match self.server().latches_kept() {
            0 => Vec::new(),
            n => vec![format!("{n} latches kept in memory")],
        }
    }
}

/// `PUBSUB NUMSUB <channel>` on one server (`None` on a Cluster, where
/// each node counts its own clients).
fn numsub(cli: impl Fn(&[&str]) -> String, cluster: bool, channel: &str) -> Option<usize> {
    if cluster {
        return None;
    }
    let answer = cli(&["PUBSUB", "NUMSUB", channel]);
    answer.lines().nth(1).and_then(|n| n.trim().parse().ok())
}

/// The key, if it exists.
fn existing(cli: impl Fn(&[&str]) -> String, key: &str) -> Vec<String> {
    match cli(&["EXISTS", key]).trim() {
        "0" => Vec::new(),
        _ => vec![key.to_owned()],
    }
}

fn dlock_names(name: &str) -> (String, String) {
    let base = format!("dlock:{{{name}}}:latch");
    (base.clone(), format!("{base}:changed"))
}

#[async_trait::async_trait]
impl LatchFixture for RedisFixture {
    async fn latch_subscriptions(&self, name: &str) -> Option<usize> {
        let (_, channel) = dlock_names(name);
        let cluster = self.url().contains("+cluster");
        tokio::task::block_in_place(|| numsub(|a| self.redis_cli(a), cluster, &channel))
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        let (key, _) = dlock_names(name);
        tokio::task::block_in_place(|| existing(|a| self.redis_cli(a), &key))
    }

    fn subscription_linger(&self) -> Duration {
        Duration::from_secs(1)
    }
}

#[async_trait::async_trait]
impl LatchFixture for RedissonFixture {
    async fn latch_subscriptions(&self, name: &str) -> Option<usize> {
        let channel = format!("redisson_countdownlatch__channel__{{{name}}}");
        tokio::task::block_in_place(|| numsub(|a| self.redis_cli(a), self.is_cluster(), &channel))
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        tokio::task::block_in_place(|| existing(|a| self.redis_cli(a), name))
    }

    fn subscription_linger(&self) -> Duration {
        Duration::from_secs(1)
    }
}
