//! `MultiLock` on a single Redis server: every key taken all or none in one
//! script (`redis/all_keys.rs`), checked on the server: one call per
//! attempt, nothing written when a key is busy, every key held with its own
//! token and fence, a waiter woken by the release of the key in its way.
//! The shared multi-key cases (opposite orders, give-back, cancellation)
//! run on this path in `conformance_redis`'s `multi_suite!`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, MultiLock};
use dlock_tests::servers::redis::{RedisCluster, RedisServer};

async fn client(server: &RedisServer) -> Arc<dyn LockBackend> {
    Arc::new(RedisBackend::connect(&server.url()).await.expect("connect"))
}

fn multi(backend: &Arc<dyn LockBackend>, keys: [&str; 3]) -> MultiLock {
    MultiLock::new(keys).with_backend(backend.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_keys_are_taken_in_one_script_each_with_its_own_token_and_fence() {
    let server = RedisServer::start();
    let backend = client(&server).await;
    assert!(
        backend.all_keys().is_some(),
        "a single server takes keys at once"
    );
    let lock = multi(&backend, ["acct:c", "acct:a", "acct:b"]);
    let calls = server.command_calls("evalsha") + server.command_calls("eval");
    let guard = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("all three are free");
    let after = server.command_calls("evalsha") + server.command_calls("eval");
    assert_eq!(after - calls, 1, "one script for three keys");

    let mut tokens = Vec::new();
    for key in ["acct:a", "acct:b", "acct:c"] {
        let token = server.redis_cli(&["GET", &format!("dlock:{{{key}}}")]);
        // `<32 hex digits>@<client name>` (the name is what `inspect` shows).
        let (secret, name) = token.split_once('@').unwrap_or((&token, ""));
        assert!(
            secret.len() == 32 && secret.chars().all(|c| c.is_ascii_hexdigit()) && !name.is_empty(),
            "{key} holds an owner token: {token:?}"
        );
        let pttl: i64 = server
            .redis_cli(&["PTTL", &format!("dlock:{{{key}}}")])
            .parse()
            .unwrap();
        assert!(pttl > 0, "{key} has an expiry");
        tokens.push(token);
    }
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "each key has its own token");
    let fences: Vec<(String, Option<u64>)> = guard
        .fencing_tokens()
        .into_iter()
        .map(|(key, fence)| (key.to_owned(), fence))
        .collect();
    assert_eq!(fences.len(), 3);
    for (key, fence) in &fences {
        let counter = server.redis_cli(&["GET", &format!("dlock:{{{key}}}:fence")]);
        assert_eq!(
            Some(counter.parse::<u64>().unwrap()),
            *fence,
            "{key}'s fence"
        );
    }

    // The next acquisition gets larger fences, key by key.
    guard.release().await.unwrap();
    let again = lock.try_acquire().await.unwrap().expect("free again");
    for ((key, before), (_, after)) in fences.iter().zip(again.fencing_tokens()) {
        assert!(after > *before, "{key}: fence {after:?} after {before:?}");
    }
    again.release().await.unwrap();
    for key in ["acct:a", "acct:b", "acct:c"] {
        let exists = server.redis_cli(&["EXISTS", &format!("dlock:{{{key}}}")]);
        assert_eq!(exists, "0", "{key} released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_key_writes_nothing() {
    let server = RedisServer::start();
    let backend = client(&server).await;
    // Another client holds the middle key (an operator's or another
    // library's SET, with an expiry).
    server.redis_cli(&["SET", "dlock:{acct:b}", "someone-else", "PX", "60000"]);
    let sets = server.command_calls("set");
    let lock = multi(&backend, ["acct:a", "acct:b", "acct:c"]);
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "acct:b is held"
    );
    assert_eq!(
        server.command_calls("set"),
        sets,
        "a busy attempt wrote nothing"
    );
    for key in ["acct:a", "acct:c"] {
        let exists = server.redis_cli(&["EXISTS", &format!("dlock:{{{key}}}")]);
        assert_eq!(exists, "0", "{key} was never taken");
    }
    let busy = lock.wait(Duration::ZERO).acquire().await.unwrap_err();
    assert!(
        matches!(&busy, dlock::LockError::Busy { key } if key == "acct:b"),
        "Busy names the key in the way: {busy:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_wakes_when_the_key_in_its_way_is_released() {
    let server = RedisServer::start();
    let (holder, waiter) = (client(&server).await, client(&server).await);
    // Held for a minute: only a release can let the waiter in within its wait.
    let held = Lock::new("acct:c")
        .ttl(Duration::from_secs(60))
        .with_backend(holder)
        .acquire()
        .await
        .unwrap();
    let lock = multi(&waiter, ["acct:a", "acct:b", "acct:c"]).wait(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { lock.acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "acct:c is held");
    for key in ["acct:a", "acct:b"] {
        let exists = server.redis_cli(&["EXISTS", &format!("dlock:{{{key}}}")]);
        assert_eq!(exists, "0", "{key} is not held while acct:c is waited for");
    }
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter was not woken by the release")
        .unwrap()
        .expect("all three keys");
    assert!(released.elapsed() < Duration::from_secs(30));
    assert_eq!(guard.keys().count(), 3);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_single_server_offers_the_one_script_path() {
    // The keys of different locks live in different slots of a Cluster, and
    // the memory backend has no round trip to save: both go key by key.
    let cluster = RedisCluster::start(3);
    let backend = RedisBackend::connect(&cluster.url())
        .await
        .expect("connect");
    assert!(
        backend.all_keys().is_none(),
        "a Cluster takes keys one by one"
    );
    let memory = dlock::connect("memory://").await.unwrap();
    assert!(memory.all_keys().is_none(), "memory takes keys one by one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_asked_at_once_gets_its_own_ttl() {
    // The capability is public: a caller may ask several keys at once with
    // a ttl each, and the server must hold each for its own.
    use dlock::backend::{AcquireRequest, AllOrNone};
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    let all = backend.all_keys().expect("a single server");
    let ask = |key: &str, secs: u64| AcquireRequest {
        key: key.to_owned(),
        token: format!("{:032x}", secs),
        ttl: Duration::from_secs(secs),
    };
    let reqs = [ask("ttl:short", 5), ask("ttl:long", 50)];
    let AllOrNone::Taken(leases) = all.try_acquire_all(&reqs).await.unwrap() else {
        panic!("both keys are free");
    };
    assert_eq!(leases.len(), 2);
    let pttl = |key: &str| -> i64 {
        server
            .redis_cli(&["PTTL", &format!("dlock:{{{key}}}")])
            .parse()
            .unwrap()
    };
    assert!(
        (1..=5_000).contains(&pttl("ttl:short")),
        "{}",
        pttl("ttl:short")
    );
    assert!(
        (5_001..=50_000).contains(&pttl("ttl:long")),
        "{}",
        pttl("ttl:long")
    );
    for lease in &leases {
        assert!(backend.release(lease).await.unwrap());
    }
}
