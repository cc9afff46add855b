//! Redis fencing tokens keep increasing when the fence counter is lost: a
//! restart without persistence, a flush or an eviction of the counter key
//! (as an `allkeys-*` policy would), on one server and on a Redis Cluster.
//! A paused old holder's token must never beat a new holder's, and tokens
//! increase across processes whose leases end by expiry.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::holder::{Holder, HolderSpec};
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::redis::{RedisCluster, RedisServer};

const HOLDER: &str = env!("CARGO_BIN_EXE_lock-holder");

/// Tokens do not come near 2^53 before the year 2255: JSON numbers and
/// JavaScript clients read them exactly.
const JSON_SAFE: u64 = (1 << 53) - 1;

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        RedisBackend::connect(url)
            .await
            .expect("connect to the test server"),
    )
}

/// One acquire and release of `key`; returns the fencing token. Retries
/// (bounded) while the connection comes back after a restart.
async fn one_turn(backend: &Arc<dyn LockBackend>, key: &str) -> u64 {
    let lock = Lock::new(key)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(5))
        .with_backend(backend.clone());
    let mut last_error = None;
    for _ in 0..50 {
        match lock.acquire().await {
            Ok(guard) => {
                let token = guard.fencing_token().expect("Redis gives fencing tokens");
                guard.release().await.expect("released");
                assert!(token <= JSON_SAFE, "token {token} is not JSON-safe");
                return token;
            }
            Err(e) => last_error = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no acquisition of {key} after 50 tries: {last_error:?}");
}

/// `turns` acquisitions; asserts their tokens strictly increase and returns them.
async fn turns(backend: &Arc<dyn LockBackend>, key: &str, turns: usize) -> Vec<u64> {
    let mut tokens = Vec::new();
    for _ in 0..turns {
        tokens.push(one_turn(backend, key).await);
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let before = turns(&backend, "restarted", 5).await;
    // The harness's server keeps nothing on disk (`--save '' --appendonly
    // no`): the restart loses the lock key and the fence counter.
    tokio::task::block_in_place(|| server.restart());
    assert_eq!(server.redis_cli(&["DBSIZE"]), "0", "the restart kept data");
    let after = turns(&backend, "restarted", 3).await;
    assert!(
        after[0] > *before.last().unwrap(),
        "tokens went backwards across the restart: {before:?} then {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_when_the_counter_is_evicted() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let fence_key = "dlock:{evicted}:fence";
    let mut tokens = Vec::new();
    for _ in 0..5 {
        tokens.push(one_turn(&backend, "evicted").await);
        // What an `allkeys-*` eviction policy or a FLUSHALL does to the counter.
        assert_eq!(server.redis_cli(&["DEL", fence_key]), "1");
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens went backwards after the counter was evicted: {tokens:?}"
    );
}

/// The batched acquire script (many keys in one call, under load) keeps the
/// same floor as the single one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_acquisitions_keep_increasing_when_the_counters_are_evicted() {
    const TASKS: usize = 32;
    let server = RedisServer::start();
    let redis = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let backend: Arc<dyn LockBackend> = redis.clone();
    let all_turns = |round: usize| {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let backend = backend.clone();
                tokio::spawn(async move { turns(&backend, &format!("batched:{t}"), 5).await })
            })
            .collect();
        async move {
            let mut by_key = Vec::new();
            for task in tasks {
                by_key.push(task.await.unwrap_or_else(|e| panic!("round {round}: {e}")));
            }
            by_key
        }
    };
    let before = all_turns(0).await;
    for t in 0..TASKS {
        server.redis_cli(&["DEL", &format!("dlock:{{batched:{t}}}:fence")]);
    }
    let after = all_turns(1).await;
    assert!(
        redis.metrics().batches > 0,
        "{TASKS} tasks at once never formed a batch"
    );
    for (t, (before, after)) in before.iter().zip(&after).enumerate() {
        assert!(
            after[0] > *before.last().unwrap(),
            "batched:{t}: tokens went backwards after the counter was evicted: {before:?} then {after:?}"
        );
    }
}

/// A crashed holder in another process; its lease expires, the server
/// restarts empty, and the next holder's token is still the larger one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_token_stays_below_the_next_holders_after_a_restart() {
    let mut server = RedisServer::start();
    let ttl = Duration::from_millis(1500);
    let spec = HolderSpec {
        url: server.url(),
        key: "crashed".into(),
        ttl,
        hold: Duration::from_secs(60),
        cycles: 1,
        marks: None,
    };
    // A few holders first, so that a counter restarting at 1 would be behind.
    for _ in 0..3 {
        let mut holder = Holder::spawn(
            HOLDER,
            &HolderSpec {
                hold: Duration::ZERO,
                ..spec.clone()
            },
        );
        holder.acquired(Duration::from_secs(20)).await;
        holder.finish(Duration::from_secs(20)).await;
    }
    let mut holder = Holder::spawn(HOLDER, &spec);
    let old: u64 = holder
        .acquired(Duration::from_secs(20))
        .await
        .parse()
        .expect("a numeric fencing token");
    holder.kill9().await;
    tokio::time::sleep(ttl).await;
    tokio::task::block_in_place(|| server.restart());
    let backend = connect(&server.url()).await;
    let new = one_turn(&backend, "crashed").await;
    assert!(
        new > old,
        "the new holder's token {new} does not beat the crashed holder's {old}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_on_a_cluster_that_lost_its_counters() {
    let mut cluster = RedisCluster::start(3);
    let backend = connect(&cluster.url()).await;
    let mut tokens = turns(&backend, "cluster-fence", 5).await;
    // Evicted counter (the key lives on whichever node owns its slot).
    assert_eq!(
        cluster.redis_cli(&["DEL", "dlock:{cluster-fence}:fence"]),
        "1"
    );
    tokens.extend(turns(&backend, "cluster-fence", 3).await);
    // Every node restarted without its data (nodes.conf keeps the slots).
    tokio::task::block_in_place(|| {
        for i in 0..3 {
            cluster.node_mut(i).restart();
        }
        cluster
            .wait_cluster_ok(Duration::from_secs(30))
            .expect("the cluster is ok after the restarts");
    });
    assert_eq!(
        cluster.redis_cli(&["EXISTS", "dlock:{cluster-fence}:fence"]),
        "0",
        "the restarts kept the counter"
    );
    tokens.extend(turns(&backend, "cluster-fence", 3).await);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens went backwards on the cluster: {tokens:?}"
    );
}

/// Two OS processes take turns on one key, and every other turn ends by
/// expiry: the holder is SIGKILLed and the next one waits out its ttl.
/// Returns the tokens in the order they were issued.
async fn two_processes_alternating(url: &str, key: &str) -> Vec<u64> {
    let ttl = Duration::from_millis(800);
    let spec = HolderSpec {
        url: url.to_owned(),
        key: key.into(),
        ttl,
        hold: Duration::from_secs(60),
        cycles: 1,
        marks: None,
    };
    let mut tokens = Vec::new();
    for round in 0..6 {
        let crashes = round % 2 == 0;
        // Two processes at once: one holds, the other waits for it.
        let first_spec = HolderSpec {
            hold: if crashes {
                Duration::from_secs(60)
            } else {
                Duration::from_millis(400)
            },
            ..spec.clone()
        };
        let mut first = Holder::spawn(HOLDER, &first_spec);
        tokens.push(first.acquired(Duration::from_secs(20)).await);
        let mut second = Holder::spawn(HOLDER, &spec);
        if crashes {
            // Crashed: the key expires, nobody releases it.
            first.kill9().await;
        } else {
            // Released cleanly while the second one waits.
            first.finish(Duration::from_secs(20)).await;
        }
        tokens.push(second.acquired(Duration::from_secs(20)).await);
        // The second one crashes too: the next round starts after expiry.
        second.kill9().await;
        tokio::time::sleep(ttl).await;
    }
    tokens
        .iter()
        .map(|t| t.parse().expect("a numeric fencing token"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_alternating_with_expiry_get_increasing_tokens() {
    let server = RedisServer::start();
    let tokens = two_processes_alternating(&server.url(), "alternating").await;
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing across processes and expiries: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_alternating_with_expiry_get_increasing_tokens_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let tokens = two_processes_alternating(&cluster.url(), "alternating").await;
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing across processes and expiries: {tokens:?}"
    );
}
