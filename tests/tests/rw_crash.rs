//! A reader process killed with SIGKILL frees its share of a read-write
//! lock after its ttl, on every backend with read-write locks that another
//! process can reach (the case is `dlock_tests::rw_crash`; each test starts
//! its own server).

use std::sync::Arc;
use std::time::Duration;

use dlock_tests::fixtures::etcd::EtcdFixture;
use dlock_tests::fixtures::redis::RedisFixture;
use dlock_tests::fixtures::zookeeper::{ZkFixture, SESSION_TIMEOUT};
use dlock_tests::rw_crash::{a_killed_readers_share_frees_after_its_ttl, CrashedReader};

const READER: &str = env!("CARGO_BIN_EXE_reader-holder");

/// Runs the case against `url`, whose reader leases last `ttl` and free
/// within `frees_within` of a crash.
async fn crash_a_reader(url: &str, ttl: Duration, frees_within: Duration) {
    let backend: Arc<dyn dlock::LockBackend> = dlock::connect(url).await.unwrap();
    a_killed_readers_share_frees_after_its_ttl(CrashedReader {
        binary: READER,
        url,
        backend,
        ttl,
        frees_within,
    })
    .await;
}

// Redis expiry is the server's own clock: the ttl plus scheduling slack.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let fixture = RedisFixture::single();
    let ttl = Duration::from_millis(1500);
    crash_a_reader(fixture.url(), ttl, ttl + Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster() {
    let fixture = RedisFixture::cluster();
    let ttl = Duration::from_millis(1500);
    crash_a_reader(fixture.url(), ttl, ttl + Duration::from_secs(2)).await;
}

/// etcd leases are whole seconds, checked by the server every 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd() {
    let fixture = EtcdFixture::single();
    let ttl = Duration::from_secs(2);
    crash_a_reader(fixture.url(), ttl, ttl + Duration::from_secs(2)).await;
}

/// A ZooKeeper lease ends with its session: the dead reader's node goes when
/// the server expires the session it can no longer hear from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper() {
    let fixture = ZkFixture::start().await;
    crash_a_reader(
        fixture.url(),
        SESSION_TIMEOUT,
        SESSION_TIMEOUT + Duration::from_secs(3),
    )
    .await;
}
