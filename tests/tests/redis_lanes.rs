//! Lanes (`backends/redis/transport/lanes.rs`): a Redis request made on a
//! multi-thread runtime goes on a connection of that runtime's own, opened
//! at its first request and closed when the runtime is dropped; requests of
//! a current-thread runtime take the background connection; and a lease
//! taken on a lane is renewed by dlock's thread after its runtime is gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::servers::redis::RedisServer;
use tokio::runtime::{Builder, Runtime};

/// dlock's connections to `server` (named with `CLIENT SETNAME` by nobody:
/// every client but `redis-cli`'s own `CLIENT LIST`).
fn connections(server: &RedisServer) -> usize {
    server
        .redis_cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .count()
}

/// Waits up to 5 s for `connections(server)` to be `expected`.
fn wait_for_connections(server: &RedisServer, expected: usize) -> usize {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let now = connections(server);
        if now == expected || Instant::now() >= until {
            return now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn multi_thread() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn cycle(runtime: &Runtime, backend: &Arc<dyn LockBackend>, key: &str) {
    let lock = Lock::new(key).with_backend(backend.clone());
    runtime.block_on(async {
        let guard = lock.acquire().await.expect("a free key is acquired");
        guard.release().await.expect("released");
    });
}

#[test]
fn each_multi_thread_runtime_gets_a_connection_of_its_own_until_it_is_dropped() {
    let server = RedisServer::start();
    let home = multi_thread();
    let backend: Arc<dyn LockBackend> =
        Arc::new(home.block_on(RedisBackend::connect(&server.url())).unwrap());
    // The background connection (and nothing else yet).
    let base = connections(&server);

    // A current-thread runtime's requests go to dlock's thread.
    let current = Builder::new_current_thread().enable_all().build().unwrap();
    cycle(&current, &backend, "lanes:current");
    assert_eq!(
        wait_for_connections(&server, base),
        base,
        "a current-thread runtime opened a connection"
    );

    // Each multi-thread runtime: one more connection, kept across cycles.
    let (a, b) = (multi_thread(), multi_thread());
    cycle(&a, &backend, "lanes:a");
    cycle(&a, &backend, "lanes:a");
    assert_eq!(
        wait_for_connections(&server, base + 1),
        base + 1,
        "runtime a's lane"
    );
    cycle(&b, &backend, "lanes:b");
    assert_eq!(
        wait_for_connections(&server, base + 2),
        base + 2,
        "runtime b's lane"
    );

    // A dropped runtime takes its lane's connection with it.
    drop(a);
    assert_eq!(
        wait_for_connections(&server, base + 1),
        base + 1,
        "runtime a's lane outlived it"
    );
    // The other lane and the background connection still serve.
    cycle(&b, &backend, "lanes:b");
    cycle(&current, &backend, "lanes:current");
    drop(b);
    assert_eq!(
        wait_for_connections(&server, base),
        base,
        "runtime b's lane outlived it"
    );
    drop(home);
}

#[test]
fn a_lease_taken_on_a_lane_is_renewed_after_its_runtime_is_dropped() {
    let server = RedisServer::start();
    let home = multi_thread();
    let backend: Arc<dyn LockBackend> =
        Arc::new(home.block_on(RedisBackend::connect(&server.url())).unwrap());
    let ttl = Duration::from_millis(900);
    let lane = multi_thread();
    let lock = Lock::new("lanes:outlived")
        .ttl(ttl)
        .with_backend(backend.clone());
    let guard = lane.block_on(lock.acquire()).expect("acquired on the lane");
    drop(lane);
    // Three ttls with the runtime that took it gone: renewed by dlock's
    // thread on the background connection.
    std::thread::sleep(ttl * 3);
    assert!(
        guard.is_held(),
        "the lease was lost once its runtime was dropped"
    );
    let key = dlock_tests::fixtures::redis::lock_key("lanes:outlived");
    assert_eq!(server.redis_cli(&["GET", &key]), guard.token());
    let pttl: i64 = server.redis_cli(&["PTTL", &key]).parse().unwrap();
    assert!(pttl > 0, "the key was not renewed: PTTL {pttl}");
    // Released from another runtime's lane.
    home.block_on(guard.release())
        .expect("released from another runtime");
    assert_eq!(server.redis_cli(&["EXISTS", &key]), "0");
}

/// Tasks of several multi-thread runtimes and a current-thread one take
/// turns on one key through one backend: every lane and the background
/// connection exclude each other (the server decides), and no turn is lost.
#[test]
fn lanes_of_several_runtimes_exclude_each_other_on_one_key() {
    const TURNS: usize = 50;
    let server = RedisServer::start();
    let home = multi_thread();
    let backend: Arc<dyn LockBackend> =
        Arc::new(home.block_on(RedisBackend::connect(&server.url())).unwrap());
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let overlaps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let (backend, inside, overlaps) = (backend.clone(), inside.clone(), overlaps.clone());
            std::thread::spawn(move || {
                let runtime = if i == 2 {
                    Builder::new_current_thread().enable_all().build().unwrap()
                } else {
                    multi_thread()
                };
                let lock = Lock::new("lanes:shared")
                    .wait(Duration::from_secs(20))
                    .with_backend(backend);
                runtime.block_on(async {
                    for _ in 0..TURNS {
                        let guard = lock.acquire().await.expect("acquired within the wait");
                        if inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        guard.release().await.expect("released");
                    }
                });
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a runtime's thread panicked");
    }
    assert_eq!(
        overlaps.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "two holders at once"
    );
    drop(home);
}

/// A runtime's first requests race to open its lane: eight acquisitions in
/// one task (`join!`) all wait for the one connection, and each is granted.
/// On another new runtime, acquisitions cut short by a timeout (during the
/// lane's opening, and with their script in flight) leave no lease behind,
/// and the lane serves the next one.
#[test]
fn a_new_lane_is_opened_once_under_concurrent_and_cancelled_first_requests() {
    let server = RedisServer::start();
    let home = multi_thread();
    let backend: Arc<dyn LockBackend> =
        Arc::new(home.block_on(RedisBackend::connect(&server.url())).unwrap());
    let base = connections(&server);

    let joined = multi_thread();
    let lock = |key: &str| Lock::new(key).with_backend(backend.clone());
    let (a, b, c, d, e, f, g, h) = (
        lock("lanes:join:a"),
        lock("lanes:join:b"),
        lock("lanes:join:c"),
        lock("lanes:join:d"),
        lock("lanes:join:e"),
        lock("lanes:join:f"),
        lock("lanes:join:g"),
        lock("lanes:join:h"),
    );
    joined.block_on(async {
        let guards = tokio::join!(
            a.acquire(),
            b.acquire(),
            c.acquire(),
            d.acquire(),
            e.acquire(),
            f.acquire(),
            g.acquire(),
            h.acquire()
        );
        let guards = [
            guards.0, guards.1, guards.2, guards.3, guards.4, guards.5, guards.6, guards.7,
        ];
        for guard in guards {
            guard.expect("acquired").release().await.expect("released");
        }
    });
    assert_eq!(
        wait_for_connections(&server, base + 1),
        base + 1,
        "concurrent first requests opened more than one lane connection"
    );

    let cut = multi_thread();
    cut.block_on(async {
        for i in 0..100u64 {
            let lock = Lock::new(format!("lanes:cut:{i}")).with_backend(backend.clone());
            let limit = Duration::from_micros(1 + (i * 13) % 600);
            let _ = tokio::time::timeout(limit, lock.acquire()).await;
        }
        let guard = Lock::new("lanes:cut:after")
            .with_backend(backend.clone())
            .acquire()
            .await
            .expect("the lane serves after the cut requests");
        guard.release().await.expect("released");
    });
    std::thread::sleep(Duration::from_millis(500));
    let left: Vec<String> = server
        .redis_cli(&["--scan", "--pattern", "dlock:{lanes:cut:*"])
        .lines()
        .filter(|k| !k.ends_with(":fence") && !k.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        left.is_empty(),
        "leases left behind until their ttl: {left:?}"
    );
    drop((joined, cut, home));
}
