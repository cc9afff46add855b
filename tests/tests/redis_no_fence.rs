//! `?fence=off` on one Redis server: what the option changes besides the
//! conformance suite (`conformance_redis_nofence.rs`). No fence counter is
//! ever written, a fenced and an unfenced client of one key still exclude
//! each other (the option changes the token, not the lock), the fenced
//! client's tokens keep increasing across unfenced holders, and elections,
//! whose terms are fences, are refused by name.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{Election, Lock, LockBackend, LockError};
use dlock_tests::servers::redis::{RedisCluster, RedisServer};

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        RedisBackend::connect(url)
            .await
            .expect("connect to the test server"),
    )
}

fn lock(key: &str, backend: &Arc<dyn LockBackend>) -> Lock {
    Lock::new(key)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .with_backend(backend.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfenced_locks_write_no_fence_counter_alone_or_batched() {
    let server = RedisServer::start();
    let backend = connect(&format!("{}?fence=off", server.url())).await;
    // 64 tasks on distinct keys, 20 turns each: enough at once for the
    // acquires to go out in batches (`ACQUIRE_MANY`) as well as alone.
    let tasks: Vec<_> = (0..64)
        .map(|task| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let key = format!("nofence-{task}");
                for _ in 0..20 {
                    let guard = lock(&key, &backend).acquire().await.expect("acquired");
                    assert_eq!(guard.fencing_token(), None, "{key}");
                    guard.release().await.expect("released");
                }
            })
        })
        .collect();
    let within = tokio::time::timeout(
        Duration::from_secs(60),
        futures_util::future::join_all(tasks),
    );
    for task in within.await.expect("1,280 cycles within 60 s") {
        task.expect("a task panicked");
    }
    let counters = server.redis_cli(&["--scan", "--pattern", "*fence*"]);
    assert_eq!(counters.trim(), "", "fence counters written: {counters}");
    assert_eq!(server.redis_cli(&["DBSIZE"]), "0", "keys left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_and_unfenced_clients_of_one_key_exclude_each_other() {
    let server = RedisServer::start();
    let fenced = connect(&server.url()).await;
    let unfenced = connect(&format!("{}?fence=off", server.url())).await;
    let key = "mixed";
    let mut last = 0;
    for round in 0..5 {
        let held = lock(key, &unfenced).acquire().await.expect("unfenced");
        assert_eq!(held.fencing_token(), None);
        // The counter an earlier fenced holder left is not this holder's.
        let info = unfenced.inspect(key).await.expect("inspect").expect("held");
        assert_eq!(info.fencing_token, None, "round {round}: {info:?}");
        let refused = lock(key, &fenced).try_acquire().await.expect("a try");
        assert!(
            refused.is_none(),
            "round {round}: fenced client took a held key"
        );
        held.release().await.expect("released");

        let held = lock(key, &fenced).acquire().await.expect("fenced");
        let fence = held.fencing_token().expect("the default is fenced");
        assert!(fence > last, "round {round}: fence {fence} after {last}");
        last = fence;
        let refused = lock(key, &unfenced).try_acquire().await.expect("a try");
        assert!(
            refused.is_none(),
            "round {round}: unfenced client took a held key"
        );
        held.release().await.expect("released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_are_refused_without_fences() {
    let server = RedisServer::start();
    let url = format!("{}?fence=off", server.url());
    let backend = connect(&url).await;
    let election = Election::new("no-terms").with_backend(backend.clone());
    let answer = tokio::time::timeout(Duration::from_secs(10), election.campaign("me"))
        .await
        .expect("refused at once, not after a wait");
    let Err(e @ LockError::InvalidOption { .. }) = answer else {
        panic!("an election without fences was not refused: {answer:?}");
    };
    // Not "no leader election yet": Redis has elections, this URL turned
    // the fences they need off.
    assert!(e.to_string().contains("drop `?fence=off`"), "{e}");
    assert!(!e.to_string().contains("yet"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfenced_locks_work_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let backend = connect(&format!("{}?fence=off", cluster.url())).await;
    let other = connect(&format!("{}?fence=off", cluster.url())).await;
    // Keys in different slots, so every master takes some.
    for key in (0..12).map(|i| format!("nofence-cluster-{i}")) {
        let guard = lock(&key, &backend).acquire().await.expect("acquired");
        assert_eq!(guard.fencing_token(), None, "{key}");
        let refused = lock(&key, &other).try_acquire().await.expect("a try");
        assert!(refused.is_none(), "{key}: two holders");
        guard.release().await.expect("released");
        let again = lock(&key, &other).acquire().await.expect("after release");
        again.release().await.expect("released");
        let counter = format!("dlock:{{{key}}}:fence");
        assert_eq!(cluster.redis_cli(&["EXISTS", &counter]), "0", "{counter}");
    }
}
