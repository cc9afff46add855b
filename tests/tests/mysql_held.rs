//! 10,000 locks held on MariaDB through one backend, renewed on time: a
//! binary of its own, run alone by the test command (like `held_50k`), since
//! a machine busy with other tests starves dlock's one background thread in a
//! debug build.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend};
use dlock_tests::fixtures::mysql::MysqlFixture;

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// 10,000 locks held through one backend (4 sessions, renewal statements
/// of 500 leases) for three ttls: none is lost, and all are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_held_locks_lose_none() {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    const HELD: usize = 10_000;
    let fixture = MysqlFixture::start();
    let backend = fixture.backend_for_tests().await;
    let ttl = Duration::from_secs(3);
    let started = Instant::now();
    let guards: Vec<dlock::LockGuard> = stream::iter(0..HELD)
        .map(|i| {
            let backend = backend.clone();
            async move {
                lock(&backend, &format!("held:{i}"))
                    .ttl(ttl)
                    .try_acquire()
                    .await
            }
        })
        .buffered(64)
        .try_collect::<Vec<Option<dlock::LockGuard>>>()
        .await
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            g.unwrap_or_else(|| {
                panic!(
                    "key {i} was free and refused: {:?}",
                    fixture.holder(&format!("held:{i}"))
                )
            })
        })
        .collect();
    eprintln!("{HELD} locks taken in {:?}", started.elapsed());
    tokio::time::sleep(ttl * 3).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(
        lost, 0,
        "{lost} of {HELD} leases lost while held for three ttls"
    );
    let held = fixture
        .server()
        .sql("SELECT COUNT(*) FROM dlock_fences WHERE IS_USED_LOCK(name) IS NOT NULL");
    assert_eq!(held, HELD.to_string());
    let started = Instant::now();
    stream::iter(guards)
        .map(|g| g.release())
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    eprintln!("{HELD} locks released in {:?}", started.elapsed());
}
