//! Acquisitions dropped while their script is in flight leave no lease on
//! Redis (the backend queues a release behind the script), for locks and
//! for semaphore permits. `SegmentedLock` depends on this: it drops the
//! losing segment waits of every race.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, Semaphore};
use dlock_tests::servers::redis::RedisServer;

/// Drops acquisitions after a few tens of microseconds, around the time
/// their script is on the wire; some finish first and are dropped as guards.
const ATTEMPTS: u64 = 200;

fn cut_short(i: u64) -> Duration {
    Duration::from_micros(20 + (i * 7) % 400)
}

/// Live keys matching `pattern`, after giving background releases a moment.
async fn leftovers(server: &RedisServer, pattern: &str) -> Vec<String> {
    tokio::time::sleep(Duration::from_millis(500)).await;
    server
        .redis_cli(&["--scan", "--pattern", pattern])
        .lines()
        .filter(|k| !k.ends_with(":fence") && !k.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_acquisitions_dropped_in_flight_leave_no_lease() {
    let server = RedisServer::start();
    let backend: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    for i in 0..ATTEMPTS {
        let lock = Lock::new(format!("inflight:{i}"))
            .ttl(Duration::from_secs(30))
            .with_backend(backend.clone());
        let _ = tokio::time::timeout(cut_short(i), lock.acquire()).await;
    }
    let left = leftovers(&server, "dlock:{inflight:*").await;
    assert!(
        left.is_empty(),
        "leases left behind until their ttl: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_acquisitions_dropped_in_flight_leave_no_permit() {
    let server = RedisServer::start();
    let backend: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    for i in 0..ATTEMPTS {
        let semaphore = Semaphore::new(format!("inflight-permits:{i}"), 2)
            .ttl(Duration::from_secs(30))
            .with_backend(backend.clone());
        let _ = tokio::time::timeout(cut_short(i), semaphore.acquire()).await;
    }
    let left = leftovers(&server, "dlock:{inflight-permits:*").await;
    assert!(
        left.is_empty(),
        "permits left behind until their ttl: {left:?}"
    );
}
