//! An acquire whose answer arrives after its lease's deadline is never
//! handed over (issue 23, case 3), on every backend reached through
//! reply-delaying fault proxies: one Redis server, a Redis Cluster whose
//! nodes announce the proxies, five Redlock masters, and ZooKeeper. The
//! scenario is `dlock_tests::late_answer`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::backends::redlock::RedlockBackend;
use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::LockBackend;
use dlock_tests::captured_log::CapturedLog;
use dlock_tests::fixtures::redis::lock_key;
use dlock_tests::late_answer::{a_late_grant_is_not_handed_over, late_key};
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::redis::{RedisCluster, RedisServer, RedisSet};
use dlock_tests::servers::zookeeper::ZkServer;

async fn redis(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(RedisBackend::connect(url).await.expect("connect to Redis"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_single_server() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let slow = redis(&format!("redis://{}", proxy.addr())).await;
    let fast = redis(&server.url()).await;
    a_late_grant_is_not_handed_over(&late_key(), slow, fast, &[proxy]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster() {
    let cluster = RedisCluster::start(3);
    // Each node announces its proxy's port to clients (the bus port stays its
    // own), so the slow client's every connection goes through a proxy.
    let mut proxies = Vec::new();
    for node in cluster.nodes() {
        let proxy = FaultProxy::start(node.addr()).await;
        let bus = (node.port() + 10_000).to_string();
        let port = proxy.addr().port().to_string();
        node.redis_cli(&["CONFIG", "SET", "cluster-announce-bus-port", &bus]);
        node.redis_cli(&["CONFIG", "SET", "cluster-announce-port", &port]);
        proxies.push(proxy);
    }
    // Every node must have learned every other node's announced port.
    let proxy_ports: Vec<String> = proxies
        .iter()
        .map(|p| p.addr().port().to_string())
        .collect();
    let started = Instant::now();
    while !cluster.nodes().iter().all(|node| {
        let slots = node.redis_cli(&["CLUSTER", "SLOTS"]);
        proxy_ports
            .iter()
            .all(|port| slots.lines().any(|l| l.trim() == port))
    }) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the nodes did not announce the proxies' ports within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let slow = redis(&format!("redis+cluster://{}", hosts.join(","))).await;
    // The fast client talks straight to the node that owns the key's slot
    // (the lock key and its fence share one hash tag): a cluster client
    // would follow the announced ports through the proxies too.
    let key = late_key();
    let slot = cluster.redis_cli(&["CLUSTER", "KEYSLOT", &lock_key(&key)]);
    let owner = owner_of(&cluster, slot.parse().expect("a slot number"));
    let fast = redis(&owner.url()).await;
    a_late_grant_is_not_handed_over(&key, slow, fast, &proxies).await;
}

/// The node whose own slot ranges (`CLUSTER NODES`, `myself`) hold `slot`.
fn owner_of(cluster: &RedisCluster, slot: u16) -> &RedisServer {
    cluster
        .nodes()
        .iter()
        .find(|node| {
            let nodes = node.redis_cli(&["CLUSTER", "NODES"]);
            let me = nodes
                .lines()
                .find(|l| l.contains("myself"))
                .expect("CLUSTER NODES names myself");
            me.split_whitespace().skip(8).any(|range| {
                let (from, to) = range.split_once('-').unwrap_or((range, range));
                matches!((from.parse::<u16>(), to.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
            })
        })
        .expect("a node owns the slot")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_five_masters() {
    let set = RedisSet::start(5);
    let mut proxies = Vec::new();
    for server in set.servers() {
        proxies.push(FaultProxy::start(server.addr()).await);
    }
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let slow: Arc<dyn LockBackend> = Arc::new(
        RedlockBackend::connect(&format!("redlock://{}", hosts.join(",")))
            .await
            .expect("connect to the masters through the proxies"),
    );
    let fast: Arc<dyn LockBackend> = Arc::new(
        RedlockBackend::connect(&set.url())
            .await
            .expect("connect to the masters"),
    );
    a_late_grant_is_not_handed_over(&late_key(), slow, fast, &proxies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper() {
    let server = ZkServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let (slow, fast) = zookeeper_clients(&server, &proxy).await;
    a_late_grant_is_not_handed_over(&late_key(), slow, fast, &[proxy]).await;
}

/// A slow client through `proxy` and a fast one straight to `server`. The
/// slow one's session outlives the delayed heartbeats by far.
async fn zookeeper_clients(
    server: &ZkServer,
    proxy: &FaultProxy,
) -> (Arc<dyn LockBackend>, Arc<dyn LockBackend>) {
    let slow: Arc<dyn LockBackend> = Arc::new(
        ZooKeeperBackend::connect(&format!("zk://{}?session_timeout=20s", proxy.addr()))
            .await
            .expect("connect to ZooKeeper through the proxy"),
    );
    let fast: Arc<dyn LockBackend> = Arc::new(
        ZooKeeperBackend::connect(&server.url())
            .await
            .expect("connect to ZooKeeper"),
    );
    (slow, fast)
}

/// The stale grant is a WARN event naming the key, the reason and how late
/// the answer was (the operator's clue that replies are slower than ttls).
#[tokio::test(flavor = "current_thread")]
async fn a_late_grant_is_a_warn_event() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let slow = redis(&format!("redis://{}", proxy.addr())).await;
    let (captured, _default) = CapturedLog::at_level(tracing::Level::WARN);
    proxy.delay_replies(dlock_tests::late_answer::DELAY);
    let key = late_key();
    let late = dlock::Lock::new(&key)
        .with_backend(slow)
        .ttl(dlock_tests::late_answer::TTL)
        .try_acquire()
        .await
        .expect("an answer, if late");
    assert!(late.is_none());
    let text = captured.text();
    let event = text
        .lines()
        .find(|l| l.contains("no longer live when it would have been handed over"))
        .unwrap_or_else(|| panic!("no stale-grant event in:\n{text}"));
    for field in [
        "WARN",
        &format!("key={key}"),
        "reason=\"late_answer\"",
        "kind=\"lock\"",
        "late_by_ms=",
    ] {
        assert!(event.contains(field), "{field} missing from: {event}");
    }
}

/// Every kind of lease goes through the same hand-over: a permit, a read
/// and a write lease, and a segment, each answered after its deadline, are
/// given back, and a client on time then gets each at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_lease_is_checked_on_redis() {
    use dlock::{RwLock, SegmentedLock, Semaphore};
    use dlock_tests::late_answer::{DELAY, TTL};

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let slow = redis(&format!("redis://{}", proxy.addr())).await;
    let fast = redis(&server.url()).await;
    let key = late_key();
    proxy.delay_replies(DELAY);
    let permit = Semaphore::new(format!("{key}:permits"), 1)
        .with_backend(slow.clone())
        .ttl(TTL)
        .try_acquire()
        .await
        .expect("a permit's answer");
    assert!(permit.is_none(), "a late permit was handed over");
    let read = RwLock::new(format!("{key}:rw-read"))
        .with_backend(slow.clone())
        .ttl(TTL)
        .try_read()
        .await
        .expect("a read lease's answer");
    assert!(read.is_none(), "a late read lease was handed over");
    let write = RwLock::new(format!("{key}:rw-write"))
        .with_backend(slow.clone())
        .ttl(TTL)
        .try_write()
        .await
        .expect("a write lease's answer");
    assert!(write.is_none(), "a late write lease was handed over");
    let segment = SegmentedLock::new(format!("{key}:segments"), 1)
        .with_backend(slow)
        .ttl(TTL)
        .try_acquire()
        .await
        .expect("a segment's answer");
    assert!(segment.is_none(), "a late segment was handed over");
    // Nothing of them is left behind: a client on time gets each at once.
    tokio::time::sleep(TTL).await;
    let permit = Semaphore::new(format!("{key}:permits"), 1)
        .with_backend(fast.clone())
        .try_acquire()
        .await
        .unwrap();
    assert!(permit.is_some(), "a late permit was left held");
    let write = RwLock::new(format!("{key}:rw-write"))
        .with_backend(fast.clone())
        .try_write()
        .await
        .unwrap();
    assert!(write.is_some(), "a late write lease was left held");
    let read = RwLock::new(format!("{key}:rw-read"))
        .with_backend(fast.clone())
        .try_write()
        .await
        .unwrap();
    assert!(read.is_some(), "a late read lease was left held");
    let segment = SegmentedLock::new(format!("{key}:segments"), 1)
        .with_backend(fast)
        .try_acquire()
        .await
        .unwrap();
    assert!(segment.is_some(), "a late segment was left held");
}

/// ZooKeeper: the listing that follows the create is cut by a lost
/// connection (the proxy resets it while the answers are slow) and retried
/// on the same session; by then the lease, counted from the create, has run
/// out: it is given back, never handed over, and its node does not stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_a_listing_retried_after_a_lost_connection() {
    use dlock::{Lock, LockError};
    use dlock_tests::late_answer::TTL;

    let server = ZkServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let (slow, fast) = zookeeper_clients(&server, &proxy).await;
    let key = late_key();
    let lock = Lock::new(&key).with_backend(slow).ttl(TTL);
    // Once on time: the key's directory exists, the acquire is a create
    // and a listing.
    lock.acquire().await.unwrap().release().await.unwrap();
    proxy.delay_replies(Duration::from_millis(400));
    let trying = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_acquire().await }
    });
    // The create's answer comes at ~400 ms, the listing's would at ~800 ms:
    // the connection is cut in between, then answers come at once again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    proxy.reset();
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.pass();
    let answer = tokio::time::timeout(Duration::from_secs(20), trying)
        .await
        .expect("the try_acquire hung")
        .expect("the try_acquire panicked");
    match answer {
        Ok(None) | Err(LockError::Backend { .. }) => {}
        Ok(Some(guard)) => panic!(
            "a lease counted from a create 300 ms before was handed over after a retried listing (held: {})",
            guard.is_held()
        ),
        Err(e) => panic!("unexpected error: {e}"),
    }
    // Nothing of it stays: another client gets the key.
    let started = std::time::Instant::now();
    loop {
        let other = Lock::new(&key)
            .with_backend(fast.clone())
            .try_acquire()
            .await;
        if let Ok(Some(guard)) = other {
            guard.release().await.unwrap();
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the given-back node stayed: {other:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
