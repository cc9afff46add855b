//! Redis read-write locks as the server sees them: the layout key by key
//! (names, types, expiries, one hash slot), nothing left after the last
//! release, waiters woken when an operator deletes the lease in their way,
//! waiting writers served in arrival order, dropped and timed-out writers
//! that do not keep readers out, and fences across a restart without
//! persistence.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{LockBackend, LockError, LockGuard, RwLock};
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::redis::{rw_keys, RedisFixture};
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::redis::{RedisOptions, RedisServer};

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        RedisBackend::connect(url)
            .await
            .expect("connect to the test server"),
    )
}

fn rw(backend: &Arc<dyn LockBackend>, key: &str) -> RwLock {
    RwLock::new(key).with_backend(backend.clone())
}

/// The server's clock in ms, as the scripts read it.
fn server_ms(fixture: &RedisFixture) -> f64 {
    let time = fixture.redis_cli(&["TIME"]);
    let mut parts = time.lines().map(|p| p.trim().parse::<f64>().unwrap());
    let (s, us) = (parts.next().unwrap(), parts.next().unwrap());
    s * 1000.0 + us / 1000.0
}

fn number(text: String) -> f64 {
    text.parse()
        .unwrap_or_else(|_| panic!("not a number: {text:?}"))
}

/// The keys of the read-write lock `key` that exist, but the fence counter.
fn live_keys(fixture: &RedisFixture, key: &str) -> Vec<String> {
    let [readers, writer, waiting, order, _fence] = rw_keys(key);
    [readers, writer, waiting, order]
        .into_iter()
        .filter(|k| fixture.redis_cli(&["EXISTS", k]) == "1")
        .collect()
}

/// Waits (bounded by `limit`) until `check` holds; whether it did.
async fn until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let give_up = tokio::time::Instant::now() + limit;
    while !check() {
        if tokio::time::Instant::now() >= give_up {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layout_key_by_key_and_nothing_left_after_the_last_release() {
    let fixture = RedisFixture::single();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let key = "layout";
    let [readers, writer, waiting, order, fence] = rw_keys(key);
    let ttl = Duration::from_secs(10);

    let reader = rw(&a, key).ttl(ttl).read().await.unwrap();
    assert_eq!(fixture.redis_cli(&["TYPE", &readers]), "zset");
    let expires = number(fixture.redis_cli(&["ZSCORE", &readers, reader.token()]));
    let left = expires - server_ms(&fixture);
    assert!(
        left > 0.0 && left <= 10_000.0,
        "a reader's score is its expiry on the server's clock: {left} ms left"
    );
    let pttl = number(fixture.redis_cli(&["PTTL", &readers]));
    assert!(pttl > 0.0 && pttl <= 10_000.0, "readers set PTTL {pttl}");
    assert_eq!(fixture.redis_cli(&["EXISTS", &writer]), "0");
    assert_eq!(
        fixture.redis_cli(&["GET", &fence]),
        reader.fencing_token().unwrap().to_string(),
        "a read's fence is the counter"
    );
    let kept = number(fixture.redis_cli(&["PTTL", &fence]));
    assert!(
        kept > 86_000_000.0 && kept <= 86_400_000.0,
        "the counter is kept for the default fence retention, one day: PTTL {kept}"
    );

    // A writer waits: its mark turns new readers away.
    let writing = tokio::spawn({
        let lock = rw(&b, key).ttl(ttl).wait(Duration::from_secs(30));
        async move { lock.write().await }
    });
    let marked = until(Duration::from_secs(10), || {
        fixture.redis_cli(&["ZCARD", &waiting]) == "1"
    });
    assert!(marked.await, "the waiting writer left no mark within 10 s");
    assert_eq!(fixture.redis_cli(&["TYPE", &waiting]), "zset");
    assert_eq!(fixture.redis_cli(&["TYPE", &order]), "zset");
    let marked = fixture.redis_cli(&["ZRANGE", &waiting, "0", "-1"]);
    assert_eq!(fixture.redis_cli(&["ZRANGE", &order, "0", "-1"]), marked);
    let mark_left = number(fixture.redis_cli(&["ZSCORE", &waiting, &marked])) - server_ms(&fixture);
    assert!(
        mark_left > 0.0 && mark_left <= 1_000.0,
        "a mark lives at most 1 s: {mark_left} ms left"
    );
    let arrived = number(fixture.redis_cli(&["ZSCORE", &order, &marked])) / 1000.0;
    assert!(
        arrived <= server_ms(&fixture) && arrived > server_ms(&fixture) - 10_000.0,
        "the order is the arrival on the server's clock (µs): {arrived} ms"
    );
    assert!(number(fixture.redis_cli(&["PTTL", &waiting])) <= 3_000.0);
    assert!(
        rw(&a, key).try_read().await.unwrap().is_none(),
        "a reader came in past a waiting writer"
    );

    reader.release().await.unwrap();
    let writer_guard = tokio::time::timeout(Duration::from_secs(10), writing)
        .await
        .expect("the writer was not served after the reader's release")
        .unwrap()
        .unwrap();
    assert_eq!(
        writer_guard.token(),
        marked,
        "the mark was the writer's token"
    );
    assert_eq!(fixture.redis_cli(&["TYPE", &writer]), "string");
    assert_eq!(fixture.redis_cli(&["GET", &writer]), writer_guard.token());
    let pttl = number(fixture.redis_cli(&["PTTL", &writer]));
    assert!(pttl > 0.0 && pttl <= 10_000.0, "writer PTTL {pttl}");
    assert_eq!(
        live_keys(&fixture, key),
        std::slice::from_ref(&writer),
        "only the writer is left while it holds"
    );
    let write_fence = writer_guard.fencing_token().unwrap();
    assert_eq!(fixture.redis_cli(&["GET", &fence]), write_fence.to_string());

    writer_guard.release().await.unwrap();
    assert!(
        live_keys(&fixture, key).is_empty(),
        "keys left after the last release: {:?}",
        live_keys(&fixture, key)
    );
    let all = fixture.redis_cli(&["--scan", "--pattern", "dlock:{layout}*"]);
    assert_eq!(
        all, fence,
        "only the fence counter stays (until its retention passes), as a lock's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_and_the_channel_are_in_one_cluster_slot() {
    let fixture = RedisFixture::cluster();
    let key = "slot:{odd}%";
    let escaped = "slot:%7Bodd%7D%25";
    let a = fixture.backend().await;
    let reader = rw(&a, key).read().await.unwrap();
    let [readers, writer, waiting, order, fence] = rw_keys(escaped);
    let channel = format!("dlock:{{{escaped}}}:rw:released");
    let slots: Vec<String> = [&readers, &writer, &waiting, &order, &fence, &channel]
        .iter()
        .map(|k| fixture.redis_cli(&["CLUSTER", "KEYSLOT", k]))
        .collect();
    assert!(slots.iter().all(|s| *s == slots[0]), "{slots:?}");
    assert_eq!(
        fixture.redis_cli(&["EXISTS", &readers]),
        "1",
        "the key was escaped as a lock's is"
    );
    reader.release().await.unwrap();
    let writer_guard = rw(&a, key).write().await.unwrap();
    writer_guard.release().await.unwrap();
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Read,
    Write,
}

async fn take(lock: RwLock, mode: Mode) -> Result<LockGuard, LockError> {
    match mode {
        Mode::Read => lock.read().await,
        Mode::Write => lock.write().await,
    }
}

/// Holds `first` on `key`, starts a waiter of `then` mode (wait 20 s,
/// far below the holder's 60 s ttl), deletes `deleted` as an operator
/// would, and returns the waiter's guard: it can only have come from the
/// delete.
async fn waiter_after_operator_delete(
    fixture: &RedisFixture,
    key: &str,
    first: Mode,
    then: Mode,
    deleted: &str,
) -> LockGuard {
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let ttl = Duration::from_secs(60);
    let held = take(rw(&a, key).ttl(ttl), first).await.unwrap();
    let waiting = tokio::spawn(take(
        rw(&b, key).ttl(ttl).wait(Duration::from_secs(20)),
        then,
    ));
    // Let the waiter try, subscribe and settle into its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter got in past the holder");
    assert_eq!(fixture.redis_cli(&["DEL", deleted]), "1");
    let guard = waiting
        .await
        .unwrap()
        .expect("the waiter was not woken by the operator's DEL");
    let err = held.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
    guard
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_del_of_the_readers_or_the_writer_wakes_waiters() {
    let fixture = RedisFixture::single();
    let [readers, ..] = rw_keys("del-readers");
    let writer =
        waiter_after_operator_delete(&fixture, "del-readers", Mode::Read, Mode::Write, &readers)
            .await;
    writer.release().await.unwrap();
    let [_, writer_key, ..] = rw_keys("del-writer");
    let reader =
        waiter_after_operator_delete(&fixture, "del-writer", Mode::Write, Mode::Read, &writer_key)
            .await;
    reader.release().await.unwrap();
}

/// With the re-check off, only the keyspace notification of the `DEL` can
/// wake the reader (its wait is a third of the writer's ttl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keyspace_notifications_an_operators_del_wakes_waiters_without_rechecks() {
    let fixture = RedisFixture::single_with(
        RedisOptions::new().config(["--notify-keyspace-events", "Kgx"]),
        "?recheck_ms=0",
    );
    let [_, writer_key, ..] = rw_keys("notified");
    let reader =
        waiter_after_operator_delete(&fixture, "notified", Mode::Write, Mode::Read, &writer_key)
            .await;
    reader.release().await.unwrap();
}

/// Two writers wait behind a reader, each from its own client; when the
/// reader leaves, the one that waited first is served first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_writers_are_served_in_arrival_order() {
    let fixture = RedisFixture::single();
    let key = "writers-in-order";
    let [_, _, waiting, ..] = rw_keys(key);
    let reader = rw(&fixture.backend().await, key).read().await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut writers = Vec::new();
    for name in ["first", "second"] {
        let lock = rw(&fixture.backend().await, key).wait(Duration::from_secs(30));
        let order_tx = order_tx.clone();
        writers.push(tokio::spawn(async move {
            let guard = lock.write().await.expect("a waiting writer");
            order_tx.send(name).unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            guard.release().await.unwrap();
        }));
        let marks = writers.len().to_string();
        let marked = until(Duration::from_secs(10), || {
            fixture.redis_cli(&["ZCARD", &waiting]) == marks
        });
        assert!(marked.await, "writer {name} left no mark within 10 s");
    }
    reader.release().await.unwrap();
    for writer in writers {
        tokio::time::timeout(Duration::from_secs(20), writer)
            .await
            .expect("the writers were not served within 20 s")
            .unwrap();
    }
    let served: Vec<&str> = std::iter::from_fn(|| order_rx.try_recv().ok()).collect();
    assert_eq!(served, ["first", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_or_timed_out_writer_does_not_keep_readers_out() {
    let fixture = RedisFixture::single();
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let key = "dropped-writer";
    let [_, _, waiting, ..] = rw_keys(key);
    let ttl = Duration::from_secs(30);
    let reader = rw(&a, key).ttl(ttl).read().await.unwrap();

    // A writer whose wait runs out takes its mark away before it returns.
    let err = rw(&b, key)
        .ttl(ttl)
        .wait(Duration::from_millis(300))
        .write()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert_eq!(fixture.redis_cli(&["EXISTS", &waiting]), "0");
    let second = rw(&c, key).try_read().await.unwrap();
    second
        .expect("a timed-out writer kept a reader out")
        .release()
        .await
        .unwrap();

    // A writer whose future is dropped while it waits: its mark goes in
    // the background, announced, so a waiting reader comes in at once. A
    // mark of a 30 s ttl would otherwise live 1 s: the reader's 600 ms
    // wait tells the two apart.
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        rw(&b, key).ttl(ttl).wait(Duration::from_secs(30)).write(),
    )
    .await;
    assert!(dropped.is_err(), "the writer got in past a reader");
    let late = rw(&c, key)
        .ttl(ttl)
        .wait(Duration::from_millis(600))
        .read()
        .await
        .expect("a dropped writer's mark kept a reader out");
    late.release().await.unwrap();
    reader.release().await.unwrap();
    assert!(
        live_keys(&fixture, key).is_empty(),
        "{:?}",
        live_keys(&fixture, key)
    );
}

/// Acquisitions of both modes dropped around the time their script is on
/// the wire leave no lease and no mark behind (the backend queues a
/// clean-up behind the script), on free and on held locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_dropped_in_flight_leave_nothing_behind() {
    const ATTEMPTS: u64 = 120;
    let fixture = RedisFixture::single();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let held = rw(&a, "inflight:held").read().await.unwrap();
    for i in 0..ATTEMPTS {
        let key = if i % 3 == 0 {
            "inflight:held".to_owned()
        } else {
            format!("inflight:{i}")
        };
        let lock = rw(&b, &key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30));
        let cut = Duration::from_micros(20 + (i * 37) % 2000);
        if i % 2 == 0 {
            let _ = tokio::time::timeout(cut, lock.write()).await;
        } else {
            let _ = tokio::time::timeout(cut, lock.read()).await;
        }
    }
    held.release().await.unwrap();
    // Well below the 30 s ttl and the 3 s marks: what goes is cleaned up.
    let mut left = Vec::new();
    let clean = until(Duration::from_secs(2), || {
        left = fixture
            .redis_cli(&["--scan", "--pattern", "dlock:{inflight:*"])
            .lines()
            .filter(|k| !k.ends_with(":rw:fence") && !k.is_empty())
            .map(str::to_owned)
            .collect();
        left.is_empty()
    })
    .await;
    assert!(clean, "leases or marks left behind: {left:?}");
}

/// Read and write leases are renewed in batches: one pipeline per mode
/// per renewal tick, not one round trip per lease; all stay held on the
/// server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_and_write_leases_are_renewed_in_batches() {
    const EACH: usize = 50;
    let server = RedisServer::start();
    let redis = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let backend: Arc<dyn LockBackend> = redis.clone();
    let ttl = Duration::from_millis(1500);
    let mut guards = Vec::new();
    for i in 0..EACH {
        guards.push(rw(&backend, "batched:read").ttl(ttl).read().await.unwrap());
        let key = format!("batched:write:{i}");
        guards.push(rw(&backend, &key).ttl(ttl).write().await.unwrap());
    }
    let before = redis.metrics().renew_round_trips;
    tokio::time::sleep(ttl * 3).await;
    let round_trips = redis.metrics().renew_round_trips - before;
    assert!(guards.iter().all(|g| g.is_held()), "some leases lapsed");
    let [readers, ..] = rw_keys("batched:read");
    assert_eq!(server.redis_cli(&["ZCARD", &readers]), EACH.to_string());
    let [_, writer, ..] = rw_keys(&format!("batched:write:{}", EACH - 1));
    assert_eq!(server.redis_cli(&["EXISTS", &writer]), "1");
    println!(
        "renewal round trips for {} leases over 3 ttls: {round_trips}",
        2 * EACH
    );
    // Three ttls are nine renewal ticks, two pipelines each (one per
    // mode); allow for ticks split by timing, and stay far from one round
    // trip per lease per tick (900).
    assert!(
        (3..=60).contains(&round_trips),
        "{round_trips} renewal round trips for {} leases over 3 ttls",
        2 * EACH
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Fences keep their order across a restart that loses every key: a read
/// after it is not below the last write before it, and the next write is
/// above both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_their_order_across_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let key = "restarted";
    let write = turn(&backend, key, true).await;
    let read = turn(&backend, key, false).await;
    assert_eq!(read, write, "a read names the write it follows");
    tokio::task::block_in_place(|| server.restart());
    assert_eq!(server.redis_cli(&["DBSIZE"]), "0", "the restart kept data");
    let read_after = turn(&backend, key, false).await;
    assert!(
        read_after >= write,
        "a read after the restart ({read_after}) is below the write before it ({write})"
    );
    let write_after = turn(&backend, key, true).await;
    assert!(
        write_after > read_after,
        "the next write ({write_after}) is not above the read before it ({read_after})"
    );
    let read_last = turn(&backend, key, false).await;
    assert_eq!(read_last, write_after);
}

/// One read or write of `key`, released at once; its fence. Retries
/// (bounded) while the connection comes back after a restart.
async fn turn(backend: &Arc<dyn LockBackend>, key: &str, write: bool) -> u64 {
    let lock = rw(backend, key)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(5));
    let mut last_error = None;
    for _ in 0..50 {
        let mode = if write { Mode::Write } else { Mode::Read };
        let guard = take(lock.clone(), mode).await;
        match guard {
            Ok(guard) => {
                let fence = guard.fencing_token().expect("Redis gives fences");
                guard.release().await.expect("released");
                return fence;
            }
            Err(e) => last_error = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no turn on {key} after 50 tries: {last_error:?}");
}

/// Issue 23, case 2, argued: on a Redis Cluster, could the client
/// (redis-rs 1.8.1 `cluster_async`) send a writer's acquire again after the
/// `ABANDON` its drop or failure queued, and leave the writer key (readers
/// shut out) until its ttl? Not by a retry: a retry is dispatched only
/// while its caller still waits (`Request::poll` and `dispatch_pending`
/// skip a request whose answer channel is closed), and every copy sent
/// before is on the node's connection ahead of the `ABANDON`. Here every
/// node is paused for scripts while a writer tries: its acquire is on the
/// wire, the request times out (200 ms), the acquisition fails with the
/// outcome unknown and queues its `ABANDON`. Once the nodes run the
/// acquire (which takes the free writer key) and then the `ABANDON`,
/// nothing of the writer is left and a reader gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_writer_whose_acquire_ran_late_leaves_no_writer_key() {
    let cluster = dlock_tests::servers::redis::RedisCluster::start(3);
    let backend = connect(&format!("{}?timeout_ms=200", cluster.url())).await;
    let key = "resent-writer";
    let writer = rw_keys(key)[1].clone();
    for node in cluster.nodes() {
        node.redis_cli(&["CLIENT", "PAUSE", "2000", "WRITE"]);
    }
    let lock = rw(&backend, key)
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(30));
    let attempt = tokio::time::timeout(Duration::from_secs(1), lock.write()).await;
    assert!(
        !matches!(attempt, Ok(Ok(_))),
        "the writer got in through paused nodes: {attempt:?}"
    );
    // The pause ends within 2 s of its start; the queued copies and the
    // ABANDON run then.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        cluster.redis_cli(&["EXISTS", &writer]),
        "0",
        "a failed writer's acquire ran after its ABANDON and kept the writer key"
    );
    let reader = rw(&backend, key)
        .try_read()
        .await
        .unwrap()
        .expect("readers are shut out by a dropped writer");
    reader.release().await.unwrap();
}
