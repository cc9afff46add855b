//! The node-redisson interop cases of dlock's Redisson layout, each run on
//! one Redis server and on a Redis Cluster by `tests/tests/redisson_interop.rs`.
//!
//! Waiters on both sides are given no re-check (`recheck_ms=0` for dlock;
//! node-redisson waits for the holder's `PTTL`, 30 s under its watchdog),
//! so a hand-over within the bound is the release message's doing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError, LockGuard};

use crate::conformance::unique_key;
use crate::fixtures::redisson::RedissonFixture;
use crate::redisson::{epoch_ms, NodeRedisson};

/// The bound asserted on a wake-up across clients (the target is 100 ms).
const WAKE_BOUND_MS: u64 = 500;

/// node-redisson's default watchdog: a waiter that missed the message would
/// wait most of this.
const NODE_WATCHDOG: Duration = Duration::from_secs(30);

async fn backend(fixture: &RedissonFixture) -> Arc<dyn LockBackend> {
    let url = format!("{}&recheck_ms=0", fixture.url());
    dlock::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

fn channel(key: &str) -> String {
    format!("redisson_lock__channel:{{{key}}}")
}

/// A node-redisson holder keeps dlock out (and shows as a holder that is
/// not dlock); once it unlocks, dlock takes the lock and keeps
/// node-redisson out; after dlock's release node-redisson takes it.
pub async fn each_keeps_the_other_out(fixture: &RedissonFixture) {
    let key = unique_key("redisson-exclusion");
    let dlock = backend(fixture).await;
    let mut node = NodeRedisson::start(fixture, NODE_WATCHDOG).await;
    node.lock(&key, Duration::from_secs(10)).await;
    assert!(
        lock(&dlock, &key).try_acquire().await.unwrap().is_none(),
        "dlock took a node-redisson lock"
    );
    let info = lock(&dlock, &key)
        .inspect()
        .await
        .unwrap()
        .expect("held by node-redisson");
    assert_eq!(info.holder, None, "{info:?}");
    assert_eq!(fixture.redis_cli(&["TYPE", &key]), "hash");
    node.unlock(&key).await;

    let guard = lock(&dlock, &key)
        .try_acquire()
        .await
        .unwrap()
        .expect("free after node's unlock");
    assert_eq!(fixture.redis_cli(&["HLEN", &key]), "1");
    assert!(
        !node.try_lock(&key).await,
        "node-redisson took dlock's lock"
    );
    guard.release().await.unwrap();
    assert!(node.try_lock(&key).await, "free after dlock's release");
    node.unlock(&key).await;
    assert_eq!(fixture.redis_cli(&["EXISTS", &key]), "0");
}

/// dlock holds `key` (ttl 30 s) and node-redisson's `lock()` waits for
/// it, subscribed to `node_channel`: dlock's guard.
async fn node_waits_behind_dlock(
    dlock: &Arc<dyn LockBackend>,
    node: &mut NodeRedisson,
    key: &str,
    node_channel: &str,
) -> LockGuard {
    let guard = lock(dlock, key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    node.send(&format!("lock {key}")).await;
    node.subscribed(node_channel, Duration::from_secs(10)).await;
    guard
}

/// `lock` waits while node-redisson holds `key`, which it unlocks 500 ms
/// later (the waiter is subscribed and past its first try by then): when
/// dlock was granted, its guard, and when node-redisson unlocked (epoch
/// ms).
async fn wait_for_node_unlock(
    lock: &Lock,
    node: &mut NodeRedisson,
    key: &str,
) -> (u64, Result<LockGuard, LockError>, u64) {
    let waiter = async {
        let guard = lock.acquire().await;
        (epoch_ms(), guard)
    };
    let unlocker = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        node.unlock(key).await
    };
    let ((granted, guard), unlocked) = tokio::join!(waiter, unlocker);
    (granted, guard, unlocked)
}

/// node-redisson's unlock wakes a waiting dlock acquire by its message.
pub async fn node_release_wakes_a_dlock_waiter(fixture: &RedissonFixture) {
    let key = unique_key("redisson-wakes-dlock");
    let dlock = backend(fixture).await;
    let mut node = NodeRedisson::start(fixture, NODE_WATCHDOG).await;
    node.lock(&key, Duration::from_secs(10)).await;
    let lock = lock(&dlock, &key).wait(Duration::from_secs(20));
    let (granted, guard, unlocked) = wait_for_node_unlock(&lock, &mut node, &key).await;
    assert!(granted >= unlocked, "dlock was granted a held lock");
    let guard = guard.expect("dlock's waiter was granted");
    let woke = granted.saturating_sub(unlocked);
    println!("node-redisson unlock -> dlock waiter granted: {woke} ms");
    assert!(woke < WAKE_BOUND_MS, "woken after {woke} ms");
    guard.release().await.unwrap();
}

/// dlock's release (or a dropped guard, `drop = true`) wakes a waiting
/// node-redisson `lock()` by its message.
pub async fn dlock_release_wakes_a_node_waiter(fixture: &RedissonFixture, drop: bool) {
    let key = unique_key("redisson-wakes-node");
    let dlock = backend(fixture).await;
    let mut node = NodeRedisson::start(fixture, NODE_WATCHDOG).await;
    let guard = node_waits_behind_dlock(&dlock, &mut node, &key, &channel(&key)).await;
    let released = epoch_ms();
    if drop {
        std::mem::drop(guard);
    } else {
        guard.release().await.unwrap();
    }
    let granted = node.locked(&key, Duration::from_secs(20)).await;
    let woke = granted.saturating_sub(released);
    let how = if drop { "drop" } else { "release" };
    println!("dlock {how} -> node-redisson waiter granted: {woke} ms");
    assert!(woke < WAKE_BOUND_MS, "woken after {woke} ms");
    node.unlock(&key).await;
}

/// node-redisson's watchdog and dlock's renewal each keep their lease past
/// several ttls while the other side keeps trying.
pub async fn both_renewals_outlast_their_ttls(fixture: &RedissonFixture) {
    let ttl = Duration::from_secs(1);
    let hold = Duration::from_millis(3_500);
    let dlock = backend(fixture).await;
    let mut node = NodeRedisson::start(fixture, ttl).await;

    let key = unique_key("redisson-node-watchdog");
    node.lock(&key, Duration::from_secs(10)).await;
    let start = Instant::now();
    let mut tries = 0;
    while start.elapsed() < hold {
        assert!(
            lock(&dlock, &key).try_acquire().await.unwrap().is_none(),
            "node's lease lapsed after {:?}",
            start.elapsed()
        );
        tries += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    node.unlock(&key).await;

    let key = unique_key("redisson-dlock-renewal");
    let guard = lock(&dlock, &key).ttl(ttl).acquire().await.unwrap();
    let start = Instant::now();
    while start.elapsed() < hold {
        assert!(
            !node.try_lock(&key).await,
            "dlock's lease lapsed after {:?}",
            start.elapsed()
        );
        tries += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(guard.is_held());
    guard.release().await.unwrap();
    println!("{tries} tries refused over 2 x {hold:?} of 1 s leases");
}

/// A node-redisson holder killed with `kill -9` keeps the lock until its
/// lease (the watchdog's last extension) runs out, and not much longer.
pub async fn a_killed_node_holder_frees_at_its_lease(fixture: &RedissonFixture) {
    let watchdog = Duration::from_secs(2);
    let key = unique_key("redisson-killed");
    let dlock = backend(fixture).await;
    let mut node = NodeRedisson::start(fixture, watchdog).await;
    node.lock(&key, Duration::from_secs(10)).await;
    // Past one watchdog extension.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    node.kill_9().await;
    let killed = Instant::now();
    let guard = lock(&dlock, &key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("free at the killed holder's lease");
    let after = killed.elapsed();
    println!("taken {after:?} after kill -9 of the node-redisson holder (lease {watchdog:?})");
    assert!(
        after <= watchdog + Duration::from_millis(1_500),
        "{after:?}"
    );
    guard.release().await.unwrap();
}

/// A key with a `{` that does not start with one (`cart{…}`): Java and
/// node-redisson name its channel differently, and dlock serves both. A
/// node-redisson waiter is woken by dlock's release, and a dlock waiter by
/// node-redisson's unlock (one server only: node-redisson's unlock script
/// names its channel as a key, which on a Cluster lies in another slot
/// than such a lock).
pub async fn inner_braces_wake_both_ways(fixture: &RedissonFixture) {
    let key = format!("cart{{{}}}", unique_key("redisson-braces"));
    let dlock = backend(fixture).await;
    let mut node = NodeRedisson::start(fixture, NODE_WATCHDOG).await;
    let node_channel = format!("redisson_lock__channel:{{{key}}}");
    let guard = node_waits_behind_dlock(&dlock, &mut node, &key, &node_channel).await;
    let released = epoch_ms();
    guard.release().await.unwrap();
    let woke = node
        .locked(&key, Duration::from_secs(20))
        .await
        .saturating_sub(released);
    println!("{key}: dlock release -> node-redisson waiter granted: {woke} ms");
    assert!(woke < WAKE_BOUND_MS, "woken after {woke} ms");

    let lock = lock(&dlock, &key).wait(Duration::from_secs(20));
    let (granted, guard, unlocked) = wait_for_node_unlock(&lock, &mut node, &key).await;
    let woke = granted.saturating_sub(unlocked);
    println!("{key}: node-redisson unlock -> dlock waiter granted: {woke} ms");
    assert!(woke < WAKE_BOUND_MS, "woken after {woke} ms");
    guard.expect("granted").release().await.unwrap();
}

/// The layout behind Sentinel (`redis+sentinel://…?layout=redisson`): the
/// master holds the hash, a second client is kept out and woken at the
/// release, and fences go up. `redis_cli` runs on the master.
pub async fn through_sentinel(url: &str, redis_cli: impl Fn(&[&str]) -> String) {
    let join = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{join}layout=redisson&recheck_ms=0");
    let connect = || async {
        dlock::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", dlock::url::redact(&url)))
    };
    let (a, b) = (connect().await, connect().await);
    let key = unique_key("redisson-sentinel");
    let first = lock(&a, &key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert_eq!(redis_cli(&["TYPE", &key]), "hash");
    assert!(lock(&b, &key).try_acquire().await.unwrap().is_none());
    let fence = first.fencing_token().expect("a fence");
    let waiter = lock(&b, &key).wait(Duration::from_secs(20));
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        first.release().await.unwrap();
        released
    };
    let (second, released) = tokio::join!(waiter.acquire(), releaser);
    let woke = released.elapsed();
    println!("behind Sentinel: release -> waiter granted within {woke:?}");
    assert!(woke < Duration::from_millis(WAKE_BOUND_MS), "{woke:?}");
    let second = second.unwrap();
    assert!(second.fencing_token() > Some(fence));
    second.release().await.unwrap();
}

/// On a Redis 7+ Cluster Java Redisson announces its unlock with
/// `SPUBLISH` only (its default `shardedSubscriptionMode`): a holder written
/// as Java writes it (a `<uuid>:<thread id>` field) and released as Java
/// releases it on such a Cluster (delete, `SPUBLISH 0` on the lock's
/// channel, from one script), sent with `redis-cli`, wakes a dlock waiter
/// that has no re-check at once.
pub async fn a_sharded_release_wakes_a_dlock_waiter(fixture: &RedissonFixture) {
    let key = unique_key("redisson-sharded");
    let dlock = backend(fixture).await;
    fixture.redis_cli(&["HSET", &key, "0b3c5f4e-java-client:1", "1"]);
    fixture.redis_cli(&["PEXPIRE", &key, "30000"]);
    let lock = lock(&dlock, &key).wait(Duration::from_secs(20));
    let waiter = async {
        let guard = lock.acquire().await;
        (Instant::now(), guard)
    };
    let release =
        "if redis.call('del', KEYS[1]) == 1 then redis.call('spublish', KEYS[2], ARGV[1]) end";
    let channel = channel(&key);
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sent = Instant::now();
        fixture.redis_cli(&["EVAL", release, "2", &key, &channel, "0"]);
        sent
    };
    let ((granted, guard), sent) = tokio::join!(waiter, releaser);
    let woke = granted.saturating_duration_since(sent);
    println!("a sharded (Java-style) release -> dlock waiter granted within {woke:?}");
    assert!(woke < Duration::from_millis(WAKE_BOUND_MS), "{woke:?}");
    guard.expect("granted").release().await.unwrap();
}
