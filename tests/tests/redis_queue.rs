//! Waiting across processes on Redis: waiters queue on the server, a release
//! wakes only the first of them, in arrival order; a dead waiter's ticket and
//! turn lapse; a foreign `DEL` and a client that does not queue live beside
//! the queue. Each "process" is a backend of its own (its own connections,
//! subscriber and local queue), or a real child process where one must die.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::fixtures::redis::{lock_key, RedisFixture};
use dlock_tests::holder::{Holder, HolderSpec};
use dlock_tests::servers::redis::RedisOptions;

/// Waiters of the tests, each in its own "process".
const WAITERS: usize = 5;

async fn backend(url: &str) -> Arc<RedisBackend> {
    Arc::new(
        RedisBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", dlock::url::redact(url))),
    )
}

fn lock(key: &str, backend: Arc<RedisBackend>) -> Lock {
    Lock::new(key)
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(20))
        .with_backend(backend as Arc<dyn LockBackend>)
}

/// How many tickets wait in `key`'s queue.
fn queued(fixture: &RedisFixture, key: &str) -> usize {
    let queue = format!("{}:queue", lock_key(key));
    fixture
        .redis_cli(&["ZCARD", &queue])
        .trim()
        .parse()
        .expect("ZCARD answers a number")
}

/// Waits (bounded) until `key`'s queue holds `n` tickets.
async fn until_queued(fixture: &RedisFixture, key: &str, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let now = tokio::task::block_in_place(|| queued(fixture, key));
        if now == n {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "{key}'s queue holds {now} tickets after 10 s, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waiters in five processes, queued one after another behind a holder,
/// are served in their order of arrival, and each is woken once: between
/// joining the queue and its turn it sends nothing (re-checks are off, the
/// holder's ttl is far away), then one try that takes the key and one
/// release. Before the queue every release woke every waiting process.
async fn served_in_arrival_order(fixture: RedisFixture, what: &str) {
    let url = format!("{}?recheck_ms=0", fixture.url());
    let key = "queue-order";
    let holder = lock(key, backend(&url).await).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    let mut backends = Vec::new();
    for i in 0..WAITERS {
        let backend = backend(&url).await;
        backends.push(backend.clone());
        let lock = lock(key, backend);
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await?;
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(30)).await;
            guard.release().await?;
            Ok::<_, LockError>(())
        }));
        until_queued(&fixture, key, i + 1).await;
    }
    let queued_at: Vec<u64> = backends.iter().map(|b| b.metrics().round_trips).collect();
    holder.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("every waiter is served within 20 s")
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        (0..WAITERS).collect::<Vec<_>>(),
        "{what}: served in arrival order"
    );
    for (i, backend) in backends.iter().enumerate() {
        let sent = backend.metrics().round_trips - queued_at[i];
        assert!(
            sent <= 2,
            "{what}: waiter {i} sent {sent} requests after it queued: one try that takes its turn and one release expected, no retry on the {i} releases before its turn"
        );
    }
    assert_eq!(queued(&fixture, key), 0, "{what}: the queue is empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wake_up_per_release_in_arrival_order() {
    served_in_arrival_order(RedisFixture::single(), "one server").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wake_up_per_release_in_arrival_order_on_a_cluster() {
    served_in_arrival_order(RedisFixture::cluster(), "cluster").await;
}

/// A waiter killed with SIGKILL while queued leaves its ticket behind; the
/// release gives it the turn, the turn lapses, and the waiter behind it
/// gets the key: late by at most the turn (1 s) and a re-check, never
/// stuck, and no two holders at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiters_turn_lapses_and_the_next_waiter_gets_the_key() {
    let fixture = RedisFixture::single();
    let key = "queue-dead";
    let holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let mut dead = Holder::spawn(
        env!("CARGO_BIN_EXE_lock-holder"),
        &HolderSpec {
            url: fixture.url().to_owned(),
            key: key.to_owned(),
            ttl: Duration::from_secs(30),
            hold: Duration::from_secs(60),
            cycles: 1,
            marks: None,
        },
    );
    until_queued(&fixture, key, 1).await;
    dead.kill9().await;
    let next = lock(key, backend(fixture.url()).await);
    let next = tokio::spawn(async move { next.acquire().await });
    until_queued(&fixture, key, 2).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the waiter behind a dead one gets the key within 10 s")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(guard.is_held());
    assert_eq!(queued(&fixture, key), 0, "the dead ticket is gone");
    eprintln!("behind a dead waiter: held {took:?} after the release");
    guard.release().await.unwrap();
}

/// A waiter whose wait runs out leaves the queue at once, and a turn it
/// was given passes to the next waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let fixture = RedisFixture::single_with(RedisOptions::new(), "?recheck_ms=0");
    let key = "queue-give-up";
    let holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let impatient = lock(key, backend(fixture.url()).await).wait(Duration::from_millis(300));
    let impatient = tokio::spawn(async move { impatient.acquire().await });
    until_queued(&fixture, key, 1).await;
    let patient = lock(key, backend(fixture.url()).await);
    let patient = tokio::spawn(async move { patient.acquire().await });
    until_queued(&fixture, key, 2).await;
    assert!(matches!(
        impatient.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    until_queued(&fixture, key, 1).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), patient)
        .await
        .expect("the remaining waiter is served")
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_millis(900),
        "the turn went to the waiter that is still there, not to the one that left ({:?})",
        released.elapsed()
    );
    guard.release().await.unwrap();
}

/// Beside the queue: an operator's `DEL` of the held key publishes nothing,
/// yet the queue's head gets the key (the waiters' re-check notices it and
/// the first try hands the turn to the head); and a client that does not
/// queue (a plain `SET NX`) can take a free key, but not a key whose turn
/// is pending, and queued waiters then wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_del_and_a_client_that_does_not_queue() {
    let fixture = RedisFixture::single();
    let key = "queue-foreign";
    let name = lock_key(key);
    let _holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..2 {
        let lock = lock(key, backend(fixture.url()).await);
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await?;
            order.lock().unwrap().push(i);
            Ok::<_, LockError>(guard)
        }));
        until_queued(&fixture, key, i + 1).await;
    }
    // The operator frees the key behind the holder's back.
    assert_eq!(fixture.redis_cli(&["DEL", &name]), "1");
    let first = tokio::time::timeout(Duration::from_secs(5), waiters.remove(0))
        .await
        .expect("the head is served after a DEL")
        .unwrap()
        .unwrap();
    assert_eq!(*order.lock().unwrap(), vec![0], "the head first");
    // A plain SET NX finds the key held, as it finds a pending turn.
    assert_eq!(
        fixture.redis_cli(&["SET", &name, "foreign", "NX", "PX", "30000"]),
        ""
    );
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), waiters.remove(0))
        .await
        .expect("the second waiter is served")
        .unwrap()
        .unwrap();
    assert_eq!(
        fixture.redis_cli(&["SET", &name, "foreign", "NX", "PX", "30000"]),
        "",
        "a client that does not queue cannot take a held key"
    );
    second.release().await.unwrap();
    // With nobody queued, the free key is the foreign client's; a dlock
    // waiter queues behind it and gets the key when it goes.
    assert_eq!(
        fixture.redis_cli(&["SET", &name, "foreign", "NX", "PX", "30000"]),
        "OK"
    );
    let waiter = lock(key, backend(fixture.url()).await);
    let waiter = tokio::spawn(async move { waiter.acquire().await });
    until_queued(&fixture, key, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the foreign holder still holds");
    assert_eq!(fixture.redis_cli(&["DEL", &name]), "1");
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter behind a foreign holder is served")
        .unwrap()
        .unwrap();
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// The `calls` of `command` in the server's `INFO commandstats`.
fn calls(fixture: &RedisFixture, command: &str) -> u64 {
    let stats = fixture.redis_cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A process that waits for a key again within a second of its last wait
/// is still subscribed to the key's channel: no `SUBSCRIBE`, and its first
/// try queues at once (one try to queue, one to take its turn, one
/// release: no plain try first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_again_soon_reuses_the_subscription_and_queues_at_once() {
    let fixture = RedisFixture::single_with(RedisOptions::new(), "?recheck_ms=0");
    let key = "queue-warm";
    let a = lock(key, backend(fixture.url()).await);
    let b_backend = backend(fixture.url()).await;
    let b = lock(key, b_backend.clone());
    for round in 0..2 {
        let held = a.acquire().await.unwrap();
        let subscribes = tokio::task::block_in_place(|| calls(&fixture, "subscribe"));
        let sent = b_backend.metrics().round_trips;
        let b = b.clone();
        let waiter = tokio::spawn(async move {
            let guard = b.acquire().await?;
            guard.release().await
        });
        until_queued(&fixture, key, 1).await;
        held.release().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter is served")
            .unwrap()
            .unwrap();
        let subscribed = tokio::task::block_in_place(|| calls(&fixture, "subscribe")) - subscribes;
        let sent = b_backend.metrics().round_trips - sent;
        if round == 0 {
            // (Twice on a subscriber's first use: its connection subscribes
            // to what is waited on, then the waiter's own request comes.)
            assert!(subscribed >= 1, "the first wait subscribes");
            assert_eq!(sent, 4, "plain try, queued try, the turn's try, release");
        } else {
            assert_eq!(subscribed, 0, "a wait within the linger needs no SUBSCRIBE");
            assert_eq!(sent, 3, "queued try, the turn's try, release: no plain try");
        }
    }
}
