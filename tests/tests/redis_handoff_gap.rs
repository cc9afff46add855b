//! The share the queue leaves to clients that do not queue, on keys handed
//! on now and then (per-entity locks, `order:{id}`): between dlock clients
//! alone the first hand-off of a key leaves no gap, and redis-py's blocking
//! `Lock` on such keys is still granted every time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_tests::fixtures::redis::{
    self, lock_key, queue_backend as backend, queue_lock as lock, RedisFixture,
};
use dlock_tests::foreign::py_blocking_locks;

/// The port of the fixture's single server.
fn port(fixture: &RedisFixture) -> u16 {
    fixture
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("the fixture's URL ends with its port")
}

/// Waits (bounded) until `key`'s queue holds `n` tickets.
async fn until_queued(fixture: &RedisFixture, key: &str, n: usize) {
    redis::until_queued(&|args| fixture.redis_cli(args), key, n).await;
}

/// The duration at `quantile` (0..=1) of sorted `d`.
fn at(d: &[Duration], quantile: f64) -> Duration {
    d[((d.len() - 1) as f64 * quantile).round() as usize]
}

/// Two dlock clients (default URL: `foreign_share` 30 %), 20 keys, each
/// held 100 ms by one and then handed to the other, queued behind it. Each
/// hand-off is the first of its key, and none of them leaves a gap: the
/// hand-off record says so, and the latency shows it (before, each was a
/// probe with a gap of 30/70 of the hold, 43 ms: p50 about 50 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_hand_off_of_each_key_leaves_no_gap() {
    let fixture = RedisFixture::single();
    let (a, b) = (backend(fixture.url()).await, backend(fixture.url()).await);
    let mut took = Vec::new();
    for i in 0..20 {
        let key = format!("first-handoff-{i}");
        let held = lock(&key, a.clone()).acquire().await.unwrap();
        let next = lock(&key, b.clone());
        let next = tokio::spawn(async move {
            let guard = next.acquire().await;
            (guard, Instant::now())
        });
        until_queued(&fixture, &key, 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let (guard, at) = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the queued waiter is served")
            .unwrap();
        let guard = guard.unwrap();
        took.push(at.saturating_duration_since(released));
        // `<at ms> <held ms> <gap 0|1> <ticket>`, kept a second.
        let record = fixture.redis_cli(&["GET", &format!("{}:handoff", lock_key(&key))]);
        let fields: Vec<&str> = record.split_whitespace().collect();
        assert_eq!(
            fields.get(2).copied(),
            Some("0"),
            "the first hand-off of {key} leaves no gap: {record:?}"
        );
        guard.release().await.unwrap();
    }
    took.sort();
    let (p50, max) = (at(&took, 0.5), at(&took, 1.0));
    eprintln!("first hand-off of 20 keys after a 100 ms hold: p50 {p50:?}, max {max:?}");
    assert!(
        p50 < Duration::from_millis(30),
        "hand-off p50 {p50:?}: the 43 ms gap of a probe is still paid"
    );
}

/// redis-py's blocking `Lock` (waiting up to 10 s, a `SET NX PX` every
/// 0.1 s) on 5 keys that pairs of dlock clients hand on now and then (held
/// 100 ms, handed on, held 100 ms, then 200 ms at rest): 20 acquires, each
/// granted within its wait. Such keys never pay a probe's gap; redis-py
/// gets them while they rest, and once seen holding one (its value is not
/// a dlock token) it gets its share of the hand-offs too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_blocking_lock_is_granted_on_keys_handed_on_now_and_then() {
    let fixture = RedisFixture::single();
    let (a, b) = (backend(fixture.url()).await, backend(fixture.url()).await);
    let keys: Vec<String> = (0..5).map(|i| format!("now-and-then-{i}")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let handed = Arc::new(AtomicUsize::new(0));
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut loops = Vec::new();
    for key in &keys {
        let (key, a, b) = (key.clone(), a.clone(), b.clone());
        let (stop, handed) = (stop.clone(), handed.clone());
        loops.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) && Instant::now() < give_up {
                let first = lock(&key, a.clone()).acquire().await.unwrap();
                let second = lock(&key, b.clone());
                let second = tokio::spawn(async move { second.acquire().await });
                tokio::time::sleep(Duration::from_millis(100)).await;
                first.release().await.unwrap();
                let second = second.await.unwrap().unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                second.release().await.unwrap();
                handed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    let names: Vec<String> = (0..4)
        .flat_map(|_| keys.iter().map(|k| lock_key(k)))
        .collect();
    let seen = py_blocking_locks(
        port(&fixture),
        Duration::from_secs(10),
        Duration::from_millis(50),
        &names,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for one in loops {
        tokio::time::timeout(Duration::from_secs(30), one)
            .await
            .expect("the dlock loops end")
            .unwrap();
    }
    let mut waited = seen.waited.clone();
    waited.sort();
    eprintln!(
        "redis-py blocking Lock: {} of {} granted (wait p50 {:?}, max {:?}); dlock handed on {} times",
        waited.len(),
        names.len(),
        waited.get(waited.len() / 2),
        waited.last(),
        handed.load(Ordering::Relaxed)
    );
    assert!(
        seen.refused.is_empty(),
        "redis-py's blocking Lock ran out of its 10 s wait on {:?}",
        seen.refused
    );
    assert_eq!(waited.len(), names.len(), "every acquire was granted");
    assert!(
        handed.load(Ordering::Relaxed) > 0,
        "the dlock clients took the keys meanwhile"
    );
}
