//! Replica acknowledgement and failover on a Redis Cluster whose shards
//! have replicas (issue 24): three masters with one replica each.
//!
//! - A grant waits for the replica of the key's own shard (`WAIT` goes to
//!   the key's shard master): with that replica paused, nothing is handed
//!   over (`Replication`); with `replicas=0` the grant is.
//! - A holder survives the failover of its key's shard: the shard master is
//!   killed, the cluster promotes its replica, the holder's renewals reach it,
//!   and another client is never granted the key meanwhile.

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
