//! After `dlock::shutdown()` the process holds no descriptor dlock opened:
//! its background runtime's epoll and eventfd (kept open by a runtime
//! handle until issue 68's fix), its connections' sockets, the file
//! backend's directory, lock files and inotify. In a test binary of its
//! own: `shutdown` ends dlock for the whole process.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dlock::{Lock, Semaphore};
use dlock_tests::servers::redis::RedisServer;

/// This process's open descriptors by kind (`socket`, `anon_inode:[eventpoll]`,
/// `anon_inode:[eventfd]`, `anon_inode:inotify`, or `file`).
fn descriptors() -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue; // the directory's own descriptor, closed meanwhile
        };
        let target = target.to_string_lossy().into_owned();
        let kind = if target.starts_with("socket:") {
            "socket".to_owned()
        } else if target.starts_with("anon_inode:") {
            target
        } else {
            "file".to_owned()
        };
        *kinds.entry(kind).or_default() += 1;
    }
    kinds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_descriptor_of_dlock_open() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file_url = format!("file://{}", dir.path().display());
    let before = descriptors();

    let redis = dlock::connect(&server.url()).await.unwrap();
    let files = dlock::connect(&file_url).await.unwrap();
    let mut held = Vec::new();
    for backend in [&redis, &files] {
        let lock = Lock::new("descriptors:a").with_backend(backend.clone());
        held.push(lock.acquire().await.unwrap());
        // A wait that ends, so the waiting paths opened what they open.
        let busy = lock.wait(Duration::from_millis(100)).acquire().await;
        assert!(busy.is_err());
    }
    let permit = Semaphore::new("descriptors:s", 2)
        .with_backend(redis.clone())
        .acquire()
        .await
        .unwrap();
    let during = descriptors();
    assert!(
        during.get("anon_inode:[eventpoll]") > before.get("anon_inode:[eventpoll]"),
        "dlock's runtime runs: {before:?} → {during:?}"
    );

    drop(held);
    drop(permit);
    drop((redis, files));
    dlock::shutdown().await;
    // Closing is synchronous once the last owner is gone; a socket closed
    // by a task that ends with the runtime is allowed a moment.
    let start = Instant::now();
    let mut after = descriptors();
    while after != before && start.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        after = descriptors();
    }
    assert_eq!(
        after, before,
        "descriptors left after shutdown (during: {during:?})"
    );
}
