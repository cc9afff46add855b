//! Bounded server memory (issue 27, §3): a service that locks a key per
//! order, user or job must not grow its coordination service for ever.
//! On each backend, 10,000 distinct keys are locked and released (64 at a
//! time), with a few read-write locks and semaphores besides; once their
//! leases have ended and the retention has passed, the server holds
//! nothing of dlock's (Redis: `DBSIZE` is 0; etcd: no key under any of
//! dlock's prefixes; ZooKeeper: no child under any of dlock's root nodes),
//! and a key locked again gets a fencing token above the one it had.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, RwLock, Semaphore};
use futures_util::stream::{self, StreamExt, TryStreamExt};

/// Distinct lock keys, each locked and released once.
const KEYS: usize = 10_000;
/// Read-write locks (one read and one write each) and semaphores, besides.
const OTHERS: usize = 100;
/// Acquire-and-release round trips in flight at once.
const IN_FLIGHT: usize = 64;
/// The leases' ttl: short, so what a lease leaves goes soon after it.
const TTL: Duration = Duration::from_secs(1);

/// Locks and releases every key, read-locks and write-locks each
/// read-write lock, takes a permit of each semaphore; answers the fencing
/// token `order:0` got.
async fn churn(backend: &Arc<dyn LockBackend>) -> u64 {
    let started = Instant::now();
    let first = lock_once(backend, "order:0").await;
    stream::iter(1..KEYS)
        .map(|i| lock_once(backend, format!("order:{i}")))
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<u64>>()
        .await;
    stream::iter(0..OTHERS)
        .map(|i| async move {
            let rw = RwLock::new(format!("report:{i}"))
                .with_backend(backend.clone())
                .ttl(TTL);
            rw.try_read().await?.expect("free").release().await?;
            rw.try_write().await?.expect("free").release().await?;
            let semaphore = Semaphore::new(format!("exports:{i}"), 2)
                .with_backend(backend.clone())
                .ttl(TTL);
            semaphore
                .try_acquire()
                .await?
                .expect("free")
                .release()
                .await?;
            Ok::<_, dlock::LockError>(())
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await
        .expect("read-write locks and semaphores");
    eprintln!(
        "{} keys locked and released in {:?}",
        KEYS + 3 * OTHERS,
        started.elapsed()
    );
    first
}

/// Locks `key` (it must be free), releases it, answers its fencing token.
async fn lock_once(backend: &Arc<dyn LockBackend>, key: impl Into<String>) -> u64 {
    let lock = Lock::new(key).with_backend(backend.clone()).ttl(TTL);
    let guard = lock
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("lock `{}`: {e}", lock.key()))
        .unwrap_or_else(|| panic!("`{}` is free", lock.key()));
    let fence = guard.fencing_token().expect("a fenced backend");
    guard.release().await.expect("release");
    fence
}

/// Polls `left` (what the server still holds of dlock's) until it is 0,
/// within `limit`; answers how long it took.
async fn until_empty<F, Fut>(what: &str, limit: Duration, mut left: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let start = Instant::now();
    loop {
        let n = left().await;
        if n == 0 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{what}: {n} still there {limit:?} after the last release"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The token of `order:0` locked again is above the one it had.
async fn relocked_above(backend: &Arc<dyn LockBackend>, before: u64) {
    let after = lock_once(backend, "order:0").await;
    assert!(
        after > before,
        "order:0 was fenced {before}, then {after} after its counter went"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_nothing_once_the_fence_retention_passes() {
    use dlock::backends::redis::RedisBackend;
    use dlock_tests::servers::redis::RedisServer;

    let server = RedisServer::start();
    let retention = Duration::from_secs(2);
    let url = format!("{}?fence_retention=2s", server.url());
    let backend: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(&url).await.unwrap());
    let before = churn(&backend).await;
    let dbsize = || server.redis_cli(&["DBSIZE"]).parse::<u64>().unwrap();
    assert!(dbsize() > 0, "the counters are kept for the retention");
    let took = until_empty(
        "Redis keys",
        retention + TTL * 2 + Duration::from_secs(5),
        || {
            let n = dbsize();
            async move { n }
        },
    )
    .await;
    eprintln!("Redis: DBSIZE 0 after {took:?}");
    relocked_above(&backend, before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_keeps_nothing_once_the_fence_retention_passes() {
    use dlock::backends::redis::RedisBackend;
    use dlock_tests::servers::redis::RedisCluster;

    let cluster = RedisCluster::start(3);
    let url = format!("{}?fence_retention=2s", cluster.url());
    let backend: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(&url).await.unwrap());
    let before = churn(&backend).await;
    let dbsize = || -> u64 {
        cluster
            .nodes()
            .iter()
            .map(|node| node.redis_cli(&["DBSIZE"]).parse::<u64>().unwrap())
            .sum()
    };
    let took = until_empty("Redis Cluster keys", Duration::from_secs(10), || {
        let n = dbsize();
        async move { n }
    })
    .await;
    eprintln!("Redis Cluster: DBSIZE 0 on every master after {took:?}");
    relocked_above(&backend, before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keeps_nothing_once_the_leases_end() {
    use dlock::backends::etcd::EtcdBackend;
    use dlock_tests::servers::etcd::EtcdServer;

    let server = EtcdServer::start();
    let backend: Arc<dyn LockBackend> =
        Arc::new(EtcdBackend::connect(&server.url()).await.unwrap());
    let before = churn(&backend).await;
    let client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    // `dlock/`, `dlock-rw/`, `dlock-semaphores/` (and any other root of
    // the default prefix).
    let took = until_empty("etcd keys under `dlock`", Duration::from_secs(5), || {
        let mut client = client.clone();
        async move {
            let options = etcd_client::GetOptions::new()
                .with_prefix()
                .with_count_only();
            client.get("dlock", Some(options)).await.unwrap().count() as u64
        }
    })
    .await;
    eprintln!("etcd: no key under `dlock` after {took:?}");
    // The session leases the keys lived on go once unused (5 s idle).
    let took = until_empty("etcd leases", Duration::from_secs(15), || {
        let mut client = client.clone();
        async move { client.leases().await.unwrap().leases().len() as u64 }
    })
    .await;
    eprintln!("etcd: no lease after {took:?}");
    relocked_above(&backend, before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_keeps_nothing_once_the_containers_are_cleaned_up() {
    use dlock::backends::zookeeper::ZooKeeperBackend;
    use dlock_tests::servers::zookeeper::{ZkOptions, ZkServer};

    let server = tokio::task::spawn_blocking(|| {
        ZkServer::start_with(ZkOptions {
            container_check_interval_ms: Some(500),
            ..ZkOptions::default()
        })
    })
    .await
    .unwrap();
    let url = format!("{}?session_timeout=6s", server.url());
    let zk = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    let backend: Arc<dyn LockBackend> = zk.clone();
    let before = churn(&backend).await;
    let admin = zk.client().expect("a session");
    let took = until_empty(
        "ZooKeeper nodes under /dlock, /dlock-rw and /dlock-semaphores",
        Duration::from_secs(20),
        || {
            let admin = admin.clone();
            async move {
                let mut n = 0;
                for root in ["/dlock", "/dlock-rw", "/dlock-semaphores"] {
                    n += match admin.list_children(root).await {
                        Ok(children) => children.len() as u64,
                        Err(zookeeper_client::Error::NoNode) => 0,
                        Err(e) => panic!("list {root}: {e}"),
                    };
                }
                n
            }
        },
    )
    .await;
    eprintln!("ZooKeeper: no key directory left after {took:?}");
    relocked_above(&backend, before).await;
}
