//! Many locks held on one backend stay held: ZooKeeper's renewal reads the
//! held nodes in multi-reads of bounded size, so no number of held locks
//! makes a request the server refuses. One read of every node once lost
//! every lease past about 12,000 locks on a default server (1 MiB
//! `jute.maxbuffer`, "Len error"); here the server takes at most 200,000
//! bytes, which one read of 4,000 nodes (about 360,000 bytes) exceeds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{Lock, LockBackend, LockGuard};
use dlock_tests::servers::zookeeper::{ZkOptions, ZkServer};
use tokio::task::JoinSet;

const HELD: usize = 4_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_zookeeper_locks_stay_held_past_the_servers_request_limit() {
    let server = ZkServer::start_with(ZkOptions {
        jute_max_buffer: Some(200_000),
        ..ZkOptions::default()
    });
    let url = format!("{}?session_timeout=6s", server.url());
    let backend: Arc<dyn LockBackend> = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    let ttl = Duration::from_millis(1500);
    // Taken 100 at a time: a flood of thousands of creates on the session
    // would queue the renewals of the first guards behind it (a session's
    // requests are answered in order), which is not what this test is about.
    let started = Instant::now();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(HELD);
    for batch in 0..HELD / 100 {
        let mut taking = JoinSet::new();
        for i in batch * 100..(batch + 1) * 100 {
            let lock = Lock::new(format!("held-many:{i:05}"))
                .with_backend(backend.clone())
                .ttl(ttl);
            taking.spawn(async move { lock.try_acquire().await });
        }
        while let Some(taken) = taking.join_next().await {
            guards.push(taken.unwrap().unwrap().expect("every key is free"));
        }
    }
    eprintln!("{HELD} locks taken in {:?}", started.elapsed());
    // Three ttls: every guard renews (every ttl/3) about nine times, each
    // time through reads the server takes.
    tokio::time::sleep(ttl * 3).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of {HELD} leases lost");
    // And each is still the server's: another client cannot take one.
    let other: Arc<dyn LockBackend> = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    for i in [0, HELD / 2, HELD - 1] {
        let taken = Lock::new(format!("held-many:{i:05}"))
            .with_backend(other.clone())
            .try_acquire()
            .await
            .unwrap();
        assert!(taken.is_none(), "held-many:{i:05} was free");
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}
