//! `dlock::shutdown` against a real Redis server, in a test binary of its
//! own (it ends dlock for the whole process): it releases every lease of
//! the process, stops dlock's background thread, and every later
//! acquisition, inspection or connect answers `LockError::ShutDown`.

use std::time::{Duration, Instant};

use dlock::{Lock, LockError};
use dlock_tests::servers::redis::RedisServer;

/// The names of this process's threads that dlock started (`dlock-*`; the
/// kernel keeps 15 bytes of a thread name).
fn dlock_threads() -> Vec<String> {
    let mut names = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(name) = std::fs::read_to_string(task.path().join("comm")) {
            if name.starts_with("dlock-") {
                names.push(name.trim().to_owned());
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_lease_stops_the_runtime_and_refuses_later_work() {
    let server = RedisServer::start();
    let ours = dlock::connect(&server.url()).await.unwrap();
    let other = dlock::connect(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(30);
    let a = Lock::new("shutdown:a")
        .ttl(ttl)
        .with_backend(ours.clone())
        .acquire()
        .await
        .unwrap();
    let b = Lock::new("shutdown:b")
        .ttl(ttl)
        .with_backend(ours.clone())
        .acquire()
        .await
        .unwrap();
    let permit = dlock::Semaphore::new("shutdown:s", 1)
        .ttl(ttl)
        .with_backend(ours.clone())
        .acquire()
        .await
        .unwrap();
    // Held by the process too (another client of it), and waited for.
    let held = Lock::new("shutdown:w")
        .ttl(ttl)
        .with_backend(other.clone())
        .acquire()
        .await
        .unwrap();
    let waiting = Lock::new("shutdown:w")
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(20))
        .with_backend(ours.clone());
    let waiter = tokio::spawn(async move { waiting.acquire().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lost = a.lost();
    assert_eq!(dlock_threads(), ["dlock-backgroun"], "before");

    assert_eq!(dlock::shutdown().await, 4);

    // Nothing of dlock runs any more.
    assert_eq!(dlock_threads(), Vec::<String>::new(), "after");
    // Every lease is gone from the server (asked of it directly: dlock's
    // connections are gone with its runtime).
    for key in ["shutdown:a", "shutdown:b"] {
        let exists = server.redis_cli(&["EXISTS", &format!("dlock:{{{key}}}")]);
        assert_eq!(exists.trim(), "0", "{key} still held");
    }
    assert_eq!(
        server
            .redis_cli(&["ZCARD", "dlock:{shutdown:s}:permits"])
            .trim(),
        "0"
    );
    // The waiter ends at once, without the key: granted meanwhile and given
    // back (`ShutDown`), or cut off from its connection (`Backend`).
    let start = Instant::now();
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter ended")
        .unwrap();
    assert!(
        matches!(waited, Err(LockError::ShutDown | LockError::Backend { .. })),
        "{waited:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    // `shutdown:w` was released; a grant the waiter got meanwhile was given
    // back, or (answered after the runtime stopped) expires by its 2 s ttl.
    let start = Instant::now();
    while server.redis_cli(&["EXISTS", "dlock:{shutdown:w}"]).trim() != "0" {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "the waiter's lease outlived its ttl"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The released guards: not held, their drops do nothing, release says
    // so, `lost()` stays quiet (given back, not lost).
    assert!(!a.is_held() && !b.is_held() && !held.is_held());
    drop(b);
    drop(permit);
    drop(held);
    let err = a.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
    assert!(tokio::time::timeout(Duration::from_millis(100), lost)
        .await
        .is_err());

    // Later work fails fast with `ShutDown`, naming `dlock::shutdown`.
    let lock = Lock::new("shutdown:a").with_backend(ours.clone());
    let start = Instant::now();
    let err = lock.try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::ShutDown), "{err:?}");
    assert!(err.to_string().contains("dlock::shutdown()"), "{err}");
    let err = lock
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::ShutDown), "{err:?}");
    let err = Lock::new("shutdown:a")
        .with_backend(ours.clone())
        .inspect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::ShutDown), "{err:?}");
    let err = dlock::list_locks(&*ours, "").await.unwrap_err();
    assert!(matches!(err, LockError::ShutDown), "{err:?}");
    let err = dlock::connect(&server.url()).await.unwrap_err();
    assert!(matches!(err, LockError::ShutDown), "{err:?}");
    let err = dlock::connect("memory://").await.unwrap_err();
    assert!(matches!(err, LockError::ShutDown), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    // The blocking API, from a plain thread.
    let blocking = Lock::new("shutdown:a").with_backend(ours.clone());
    let err = std::thread::spawn(move || blocking.try_acquire_blocking())
        .join()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, LockError::ShutDown), "{err:?}");
    // A second shutdown has nothing to do.
    assert_eq!(dlock::shutdown().await, 0);
    assert_eq!(dlock_threads(), Vec::<String>::new());
}
