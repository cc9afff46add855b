//! Under load the Redis backend sends queued acquire attempts and releases
//! as one script call each (`batch.rs`). These tests drive it into batching
//! and check that nothing of the lock's contract gives: exclusion across
//! connections, fencing order, and no lease left behind by a caller that
//! gave up while its request waited in a batch. One more checks the other
//! use of the connection's order: a local hand-off sends the next waiter's
//! acquire right behind the release.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::overlap::OverlapDetector;
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::redis::RedisServer;
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(30);

/// Runs `tasks` tasks that all start at once, each with its own index.
async fn all_at_once<F, Fut>(tasks: usize, body: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let start = Arc::new(Barrier::new(tasks));
    let mut running = Vec::new();
    for t in 0..tasks {
        let (start, work) = (start.clone(), body(t));
        running.push(tokio::spawn(async move {
            start.wait().await;
            work.await;
        }));
    }
    for task in running {
        task.await.expect("task panicked");
    }
}

/// One key's record of its holders: any overlap, and the fences in the
/// order they held.
#[derive(Default)]
struct Holdings {
    detector: OverlapDetector,
    fences: Mutex<Vec<u64>>,
}

impl Holdings {
    /// `turns` times: acquire, record the fence, hold across a yield (so
    /// an overlapping holder would show), release.
    async fn take_turns(&self, lock: &Lock, turns: usize) {
        for _ in 0..turns {
            let guard = lock.acquire().await.expect("acquired");
            self.detector.enter();
            self.fences
                .lock()
                .unwrap()
                .push(guard.fencing_token().expect("Redis gives fencing tokens"));
            tokio::task::yield_now().await;
            self.detector.leave();
            guard.release().await.expect("released");
        }
    }

    /// Asserts no two holders of `key` at once and fences strictly
    /// increasing in holding order; returns how many turns were held.
    fn check(&self, key: &str) -> usize {
        assert_eq!(self.detector.overlaps(), 0, "two holders of {key} at once");
        let fences = self.fences.lock().unwrap();
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "fences of {key} not strictly increasing in holding order: {fences:?}"
        );
        fences.len()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_distinct_keys_go_out_in_batches() {
    const TASKS: usize = 64;
    const CYCLES: u64 = 50;
    let server = RedisServer::start();
    let redis = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let backend: Arc<dyn LockBackend> = redis.clone();
    let before = redis.metrics();

    all_at_once(TASKS, |t| {
        let lock = Lock::new(format!("batch:{t}"))
            .ttl(TTL)
            .with_backend(backend.clone());
        async move {
            let mut last_fence = 0;
            for _ in 0..CYCLES {
                let guard = lock.acquire().await.expect("distinct key acquired");
                let fence = guard.fencing_token().expect("Redis gives fencing tokens");
                assert!(
                    fence > last_fence,
                    "fence went from {last_fence} to {fence}"
                );
                last_fence = fence;
                guard.release().await.expect("released");
            }
        }
    })
    .await;

    let after = redis.metrics();
    let requests = 2 * TASKS as u64 * CYCLES;
    let round_trips = after.round_trips - before.round_trips;
    assert!(
        after.batches > before.batches,
        "64 tasks at once never formed a batch: {after:?}"
    );
    assert!(
        round_trips < requests,
        "{requests} acquire and release requests took {round_trips} round trips: batching saved none"
    );
    let left = server.redis_cli(&["--scan", "--pattern", "dlock:{batch:*}"]);
    assert!(left.trim().is_empty(), "locks left held: {left}");
}

/// A batch carries at most eight requests: with four requests alone on a
/// slow connection (answers held back by a proxy) and forty queued behind
/// them, the forty go out as five batches of eight, oldest first, not as one
/// long script: a batch of everything queued made the server and the client
/// take turns instead of working at once (see `MAX_BATCH` in `batching.rs`).
/// Every caller gets its lock either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_carries_at_most_eight_requests() {
    const ALONE: usize = 4;
    const QUEUED: usize = 40;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let url = format!("redis://{}", proxy.addr());
    let redis = Arc::new(RedisBackend::connect(&url).await.unwrap());
    let backend: Arc<dyn LockBackend> = redis.clone();
    // The first request on this runtime opens its connection (`lanes.rs`):
    // done before the answers are held back.
    let warm = Lock::new("capped:warm")
        .ttl(TTL)
        .with_backend(backend.clone());
    warm.acquire().await.unwrap().release().await.unwrap();
    let before = redis.metrics();

    // Every request is sent or queued long before the first answer is let
    // through, so none goes alone in a slot that frees.
    proxy.delay_replies(Duration::from_millis(500));
    let guards: Vec<_> = (0..ALONE + QUEUED)
        .map(|t| {
            let lock = Lock::new(format!("capped:{t}"))
                .ttl(TTL)
                .with_backend(backend.clone());
            tokio::spawn(async move { lock.try_acquire().await })
        })
        .collect();
    let mut held = Vec::new();
    for guard in guards {
        let guard = guard.await.expect("task panicked").expect("no error");
        held.push(guard.expect("a free key is granted"));
    }
    let batches = redis.metrics().batches - before.batches;
    proxy.pass();
    assert!(
        (5..=QUEUED as u64).contains(&batches),
        "{QUEUED} queued acquisitions went out in {batches} batches, expected at least 5 of at most 8"
    );
    for guard in held {
        guard.release().await.expect("released");
    }
}

/// Two connections (as two processes would have) contend on a few keys
/// with many tasks each, so both send batches that hit the same keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_from_two_connections_never_overlap_on_a_key() {
    const KEYS: usize = 8;
    const TASKS_PER_KEY: usize = 4;
    const CYCLES: usize = 25;
    let server = RedisServer::start();
    let first: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let second: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let holdings: Arc<Vec<Holdings>> = Arc::new((0..KEYS).map(|_| Holdings::default()).collect());

    all_at_once(2 * KEYS * TASKS_PER_KEY, |t| {
        let key = t % KEYS;
        let backend = if t % 2 == 0 { &first } else { &second };
        let lock = Lock::new(format!("shared:{key}"))
            .ttl(TTL)
            .with_backend(backend.clone());
        let holdings = holdings.clone();
        async move { holdings[key].take_turns(&lock, CYCLES).await }
    })
    .await;

    for (key, held) in holdings.iter().enumerate() {
        assert_eq!(
            held.check(&format!("shared:{key}")),
            2 * TASKS_PER_KEY * CYCLES
        );
    }
}

/// Tasks of one process take turns on one key: each release hands the turn
/// to the next local waiter as soon as it is sent, and that waiter's acquire
/// goes out on the same connection right behind it. Redis runs the two in
/// order, so no attempt ever finds the key still held: exactly one acquire
/// and one release round trip per turn, and fences in holding order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_hand_off_acquires_right_behind_the_release() {
    const TASKS: usize = 8;
    const TURNS: usize = 40;
    let server = RedisServer::start();
    let redis = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let backend: Arc<dyn LockBackend> = redis.clone();
    let holdings = Arc::new(Holdings::default());
    // No warm-up: `connect` loaded the scripts, so even the first release
    // is one round trip that the next acquire queues behind.
    let before = redis.metrics();

    all_at_once(TASKS, |_| {
        let lock = Lock::new("handoff").ttl(TTL).with_backend(backend.clone());
        let holdings = holdings.clone();
        async move { holdings.take_turns(&lock, TURNS).await }
    })
    .await;

    holdings.check("handoff");
    let round_trips = redis.metrics().round_trips - before.round_trips;
    assert_eq!(
        round_trips,
        2 * (TASKS * TURNS) as u64,
        "some acquire found the key still held by the release sent before it"
    );
}

/// Callers that give up while their request waits in a batch, or while
/// the batch is on the wire, leave no lease behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_in_a_batch_leave_no_lease() {
    const TASKS: usize = 64;
    const ROUNDS: usize = 10;
    let server = RedisServer::start();
    let redis = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let backend: Arc<dyn LockBackend> = redis.clone();

    for round in 0..ROUNDS {
        all_at_once(TASKS, |t| {
            let lock = Lock::new(format!("gave-up:{round}:{t}"))
                .ttl(TTL)
                .with_backend(backend.clone());
            // From "still queued" to "answer already read".
            let patience = Duration::from_micros(50 + (t as u64 * 37) % 2_000);
            async move {
                let _ = tokio::time::timeout(patience, lock.acquire()).await;
            }
        })
        .await;
    }
    assert!(
        redis.metrics().batches > 0,
        "no batch formed, so nothing here was tested: {:?}",
        redis.metrics()
    );

    // Background releases run on this runtime; give them a moment.
    let mut left = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = server
            .redis_cli(&["--scan", "--pattern", "dlock:{gave-up:*"])
            .lines()
            .filter(|k| !k.ends_with(":fence"))
            .collect::<Vec<_>>()
            .join(" ");
        if left.is_empty() {
            break;
        }
    }
    assert!(
        left.is_empty(),
        "leases left behind until their ttl: {left}"
    );
}

/// A server that dies under load: batched callers get errors within their
/// wait, none hangs, and the backend works again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_fails_batched_callers_within_their_wait() {
    const TASKS: usize = 64;
    let mut server = RedisServer::start();
    let backend: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    server.stop();

    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let finished = tokio::time::timeout(
        Duration::from_secs(30),
        all_at_once(TASKS, |t| {
            let lock = Lock::new(format!("dead:{t}"))
                .ttl(TTL)
                .wait(Duration::from_millis(500))
                .with_backend(backend.clone());
            let outcomes = outcomes.clone();
            async move {
                let outcome = lock.acquire().await.map(drop);
                outcomes.lock().unwrap().push(outcome);
            }
        }),
    )
    .await;
    assert!(finished.is_ok(), "callers hung on a dead server");
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    assert_eq!(outcomes.len(), TASKS);
    assert!(
        outcomes.iter().all(Result::is_err),
        "a lock was granted by a dead server: {outcomes:?}"
    );

    server.start_again();
    let mut back = None;
    for _ in 0..100 {
        let lock = Lock::new("dead:after")
            .ttl(TTL)
            .with_backend(backend.clone());
        if let Ok(Some(guard)) = lock.try_acquire().await {
            back = Some(guard);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    back.expect("the backend did not recover after the restart")
        .release()
        .await
        .unwrap();
}

/// A runtime shut down while batches are queued and in flight: shutdown
/// finishes (a batch dropped with its task must not take the queue's lock
/// twice) and the queued callers' futures are simply gone.
#[test]
fn a_runtime_shut_down_with_batches_in_flight_does_not_hang() {
    let server = RedisServer::start();
    let url = server.url();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let backend: Arc<dyn LockBackend> =
                Arc::new(RedisBackend::connect(&url).await.unwrap());
            for t in 0..64 {
                let lock = Lock::new(format!("shutdown:{t}"))
                    .ttl(TTL)
                    .with_backend(backend.clone());
                tokio::spawn(async move {
                    loop {
                        if let Ok(guard) = lock.acquire().await {
                            let _ = guard.release().await;
                        }
                    }
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        // Longer than the wait below: a deadlocked worker shows as a hang,
        // not as a shutdown that gave up on it.
        runtime.shutdown_timeout(Duration::from_secs(120));
        let _ = done_tx.send(());
    });
    assert!(
        done_rx.recv_timeout(Duration::from_secs(30)).is_ok(),
        "runtime shutdown hung with batches in flight"
    );
}

/// Renewal renews up to 100 leases in one script call, each checked on its
/// own: of 250 held locks and 250 held permits, the ones whose data was
/// deleted behind their guards' backs are lost, every other is renewed,
/// and a renewal round costs three script calls per kind, not 250.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_renews_many_leases_per_script_call_each_on_its_own() {
    let server = RedisServer::start();
    let backend: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let ttl = Duration::from_millis(1500);
    let mut locks = Vec::new();
    let mut permits = Vec::new();
    for i in 0..250 {
        let lock = Lock::new(format!("renew-many:{i}"))
            .with_backend(backend.clone())
            .ttl(ttl);
        locks.push(lock.try_acquire().await.unwrap().expect("free"));
        let semaphore = dlock::Semaphore::new(format!("renew-many-permits:{i}"), 2)
            .with_backend(backend.clone())
            .ttl(ttl);
        permits.push(semaphore.try_acquire().await.unwrap().expect("free"));
    }
    // Every third of each: its data gone, as an operator's DEL does.
    let mut deleted = vec!["DEL".to_owned()];
    for i in (0..250).step_by(3) {
        deleted.push(format!("dlock:{{renew-many:{i}}}"));
        deleted.push(format!("dlock:{{renew-many-permits:{i}}}:permits"));
    }
    let deleted: Vec<&str> = deleted.iter().map(String::as_str).collect();
    assert_eq!(server.redis_cli(&deleted), "168");
    let evalsha_before = server.command_calls("evalsha");
    // Two renewals (every ttl/3) and some margin.
    tokio::time::sleep(ttl).await;
    let rounds = server.command_calls("evalsha") - evalsha_before;
    for i in 0..250 {
        let deleted = i % 3 == 0;
        assert_eq!(locks[i].is_held(), !deleted, "lock {i}");
        assert_eq!(permits[i].is_held(), !deleted, "permit {i}");
    }
    // Each round: 3 calls for 250 locks and 3 for 250 permits, about 4
    // rounds; one call per lease would be over 1,500.
    assert!(
        rounds < 250,
        "{rounds} script calls for about 4 rounds of 500 leases"
    );
    drop(locks);
    drop(permits);
}
