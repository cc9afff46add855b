//! Replica acknowledgement and failover on a Redis Cluster whose shards
//! have replicas (issue 24): three masters with one replica each.
//!
//! - A grant waits for the replica of the key's own shard (`WAIT` goes to
//!   the key's shard master): with that replica paused, nothing is handed
//!   over (`Replication`); with `replicas=0` the grant is.
//! - A holder survives the failover of its key's shard: the shard master is
//!   killed, the cluster promotes its replica, the holder's renewals reach it,
//!   and another client is never granted the key meanwhile.
//! - A failover to a replica that may evict: the masters are read again
//!   (`INFO memory`) and the next acquires refused, naming the new master.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::failover::{hands_over, held_and_awaited, held_throughout};
use dlock_tests::fixtures::redis::lock_key;
use dlock_tests::servers::{RedisCluster, RedisOptions, ServerControl};

/// Three shards with a replica each; node timeout 1 s so a failover takes
/// a few seconds.
fn cluster() -> RedisCluster {
    tokio::task::block_in_place(|| {
        RedisCluster::try_start_with_replicas(
            3,
            1,
            RedisOptions::new().cluster_node_timeout(Duration::from_millis(1000)),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    })
}

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        RedisBackend::connect(url)
            .await
            .expect("connect to the cluster"),
    )
}

/// The key's shard: its master's index and its replica's.
fn shard(cluster: &RedisCluster, key: &str) -> (usize, usize) {
    let slot: u16 = cluster
        .redis_cli(&["CLUSTER", "KEYSLOT", &lock_key(key)])
        .parse()
        .expect("a slot number");
    let (master, replicas) = cluster.shard_of(slot).unwrap_or_else(|e| panic!("{e}"));
    (master, replicas[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_waits_for_the_replica_of_its_own_shard() {
    let mut cluster = cluster();
    let key = "cluster-replicas:ack";
    let (_, replica) = shard(&cluster, key);
    let acked = connect(&cluster.url()).await;
    let unacked = connect(&format!("{}?replicas=0", cluster.url())).await;
    // Healthy: acknowledged at once.
    Lock::new(key)
        .with_backend(acked.clone())
        .acquire()
        .await
        .expect("acknowledged by the shard's replica")
        .release()
        .await
        .unwrap();
    tokio::task::block_in_place(|| cluster.node_mut(replica).pause());
    let refused = Lock::new(key)
        .with_backend(acked.clone())
        .ttl(Duration::from_secs(5))
        .try_acquire()
        .await;
    let other_key = (0..100)
        .map(|i| format!("cluster-replicas:other:{i}"))
        .find(|k| shard(&cluster, k).1 != replica)
        .expect("a key on another shard");
    // Another shard's grants are not held up by this shard's replica.
    let elsewhere = Lock::new(&other_key)
        .with_backend(acked.clone())
        .acquire()
        .await;
    let plain = Lock::new(key).with_backend(unacked).try_acquire().await;
    tokio::task::block_in_place(|| cluster.node_mut(replica).resume());
    match refused {
        Err(LockError::Replication {
            acknowledged,
            needed,
            ..
        }) => assert_eq!((acknowledged, needed), (0, 1)),
        other => panic!("expected a Replication error, got {other:?}"),
    }
    elsewhere
        .expect("a key on another shard is acknowledged by its own replica")
        .release()
        .await
        .unwrap();
    plain
        .expect("with replicas=0 the grant is handed over")
        .expect("the key is free")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_survives_the_failover_of_its_shard() {
    let mut cluster = cluster();
    let key = "cluster-replicas:failover";
    let (master, replica) = shard(&cluster, key);
    let (a, b) = (connect(&cluster.url()).await, connect(&cluster.url()).await);
    let ttl = Duration::from_secs(6);
    let (guard, waiting) = held_and_awaited(a, b, key, ttl, "A acquires").await;
    tokio::task::block_in_place(|| cluster.node_mut(master).kill9());
    // The replica takes over the shard; A's renewals must reach it: held
    // over two ttls after.
    let started = Instant::now();
    let promoted = || {
        cluster
            .node(replica)
            .redis_cli(&["ROLE"])
            .starts_with("master")
    };
    held_throughout(&guard, &waiting, promoted, ttl * 2).await;
    println!("cluster failover and two ttls took {:?}", started.elapsed());
    hands_over(guard, waiting).await;
}

/// A shard's replica set to `maxmemory 3mb` and `allkeys-lru`, then
/// promoted (`CLUSTER FAILOVER` on it): the cluster client follows the
/// new master inside itself, and the backend reads every master again
/// within `CLUSTER_REREAD` (10 s) of its last read: an acquire is refused
/// naming `maxmemory-policy` within 30 s of the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_evicting_replica_is_refused_on_a_cluster() {
    let cluster = cluster();
    let key = "cluster-replicas:evicting";
    let (_, replica) = shard(&cluster, key);
    let backend = connect(&cluster.url()).await;
    let lock = || {
        Lock::new(key)
            .ttl(Duration::from_secs(5))
            .with_backend(backend.clone())
    };
    lock()
        .try_acquire()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    let node = cluster.node(replica);
    let new_master = node.addr().to_string();
    node.redis_cli(&["CONFIG", "SET", "maxmemory", "3mb"]);
    node.redis_cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    node.redis_cli(&["CLUSTER", "FAILOVER"]);
    let failover = Instant::now();
    // Bounded: 120 tries, 30 s.
    let mut refusal = None;
    for _ in 0..120 {
        match lock().try_acquire().await {
            Err(LockError::InvalidOption { reason }) => {
                refusal = Some(reason);
                break;
            }
            Ok(Some(guard)) => guard.release().await.unwrap(),
            other => println!("before the refusal: {other:?}"),
        }
        if failover.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let reason = refusal.expect("no acquire was refused within 30 s of the failover");
    println!(
        "refused {:?} after CLUSTER FAILOVER: {reason}",
        failover.elapsed()
    );
    for part in [
        "maxmemory-policy",
        "allkeys-lru",
        "eviction=accept",
        &format!("master {new_master}"),
    ] {
        assert!(reason.contains(part), "{part} missing from: {reason}");
    }
}
