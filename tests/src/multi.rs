//! The multi-key lock suite. A `MultiLock` takes ordinary locks, so every
//! backend can run it; backends opt in with
//! [`multi_suite!`](crate::multi_suite), giving the rounds of the
//! opposite-order case (500 where a round is cheap, fewer on servers where
//! 500 would take more than about ten seconds).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError, MultiLock};

use crate::conformance::{unique_key, Fixture};
pub use crate::multi_live::*;
use crate::overlap::OverlapDetector;

/// Expands to one `#[tokio::test]` per multi-key case.
///
/// ```text
/// dlock_tests::multi_suite!(MemoryFixture::default(), rounds = 500);
/// ```
#[macro_export]
macro_rules! multi_suite {
    ($fixture:expr, rounds = $rounds:expr) => {
        mod multi {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn opposite_orders_never_deadlock_or_overlap() {
                let fixture = $fixture;
                $crate::multi::opposite_orders_never_deadlock_or_overlap(&fixture, $rounds).await;
            }

            $crate::multi_suite!(@cases $fixture;
                a_wait_that_runs_out_leaves_no_key_held,
                a_busy_key_makes_try_acquire_give_back_the_others,
                a_cancelled_acquire_leaves_no_key_held,
                fencing_tokens_strictly_increase_per_key,
                inside_the_scope_each_key_is_reentrant,
                bad_input_is_rejected,
                joined_in_one_task_they_contend,
                a_guard_of_an_idle_runtime_lives_and_ends_with_it,
                a_key_that_lapses_while_waiting_is_not_handed_over,
                a_key_lost_while_waiting_is_not_handed_over,
                a_body_never_starts_with_a_lapsed_key,
            );
        }
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $fixture;
                $crate::multi::$case(&fixture).await;
            }
        )*
    };
}

fn multi<const N: usize>(backend: &Arc<dyn LockBackend>, keys: [&str; N]) -> MultiLock {
    MultiLock::new(keys).with_backend(backend.clone())
}

/// Whether `key` is free, seen by another client: its `try_acquire` gets it
/// (and gives it back at once).
async fn is_free(backend: &Arc<dyn LockBackend>, key: &str) -> bool {
    let lock = Lock::new(key).with_backend(backend.clone());
    match lock
        .try_acquire()
        .await
        .expect("the checking client's try_acquire failed")
    {
        Some(guard) => {
            guard.release().await.expect("release the probe");
            true
        }
        None => false,
    }
}

/// Two clients, one naming the keys `[a, b]` and the other `[b, a]`, each
/// take both `rounds` times: both finish (no deadlock, bounded by a 240 s
/// timeout) and no key ever has two holders (an overlap detector per key).
pub async fn opposite_orders_never_deadlock_or_overlap<F: Fixture>(fixture: &F, rounds: usize) {
    let (a, b) = (unique_key("multi-a"), unique_key("multi-b"));
    let detectors: Arc<[OverlapDetector; 2]> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for order in [[a.clone(), b.clone()], [b.clone(), a.clone()]] {
        let backend = fixture.backend().await;
        let lock = MultiLock::new(order)
            .with_backend(backend)
            .wait(Duration::from_secs(60));
        let (detectors, a) = (detectors.clone(), a.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let guard = lock.acquire().await.expect("acquire both keys");
                assert_eq!(guard.keys().next(), Some(a.as_str()), "not canonical");
                detectors.iter().for_each(OverlapDetector::enter);
                tokio::task::yield_now().await;
                detectors.iter().for_each(OverlapDetector::leave);
                guard.release().await.expect("release both keys");
            }
        }));
    }
    tokio::time::timeout(Duration::from_secs(240), async {
        for task in tasks {
            task.await.expect("a contending task panicked");
        }
    })
    .await
    .expect("the two orders did not finish within 240 s: a deadlock, or a lost wake-up");
    println!(
        "{rounds} rounds x 2 opposite orders in {:?}",
        started.elapsed()
    );
    for (key, detector) in [a, b].iter().zip(detectors.iter()) {
        assert_eq!(detector.overlaps(), 0, "two holders overlapped on {key}");
    }
}

/// The middle key is held by another client: the wait runs out with a
/// `Timeout` naming it, and the keys before and after it are free
/// afterwards, as a third client sees them.
pub async fn a_wait_that_runs_out_leaves_no_key_held<F: Fixture>(fixture: &F) {
    let base = unique_key("multi-timeout");
    let keys = [
        format!("{base}:1"),
        format!("{base}:2"),
        format!("{base}:3"),
    ];
    let (holder, taker, checker) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let middle = Lock::new(&keys[1])
        .with_backend(holder)
        .acquire()
        .await
        .unwrap();
    let lock = MultiLock::new(keys.clone())
        .with_backend(taker)
        .wait(Duration::from_millis(500));
    match lock.acquire().await {
        Err(LockError::Timeout { key, .. }) => assert_eq!(key, keys[1]),
        other => panic!("expected a timeout on {}, got {other:?}", keys[1]),
    }
    assert!(
        is_free(&checker, &keys[0]).await,
        "the first key stayed held"
    );
    assert!(is_free(&checker, &keys[2]).await, "the last key was taken");
    assert!(
        !is_free(&checker, &keys[1]).await,
        "the holder lost the middle key"
    );
    middle.release().await.unwrap();
    // With the middle key free, the same lock takes all three.
    let all = lock.acquire().await.expect("all three keys are free now");
    assert_eq!(all.keys().count(), 3);
    all.release().await.unwrap();
}

/// `try_acquire` meets a held last key: `None`, and the key it took first
/// is free again; with a zero wait, `acquire` is `Busy` naming that key.
pub async fn a_busy_key_makes_try_acquire_give_back_the_others<F: Fixture>(fixture: &F) {
    let base = unique_key("multi-busy");
    let (first, last) = (format!("{base}:a"), format!("{base}:z"));
    let (holder, taker, checker) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let held = Lock::new(&last)
        .with_backend(holder)
        .acquire()
        .await
        .unwrap();
    let lock = multi(&taker, [last.as_str(), first.as_str()]);
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert!(
        is_free(&checker, &first).await,
        "try_acquire kept the first key"
    );
    match lock.clone().wait(Duration::ZERO).acquire().await {
        Err(LockError::Busy { key }) => assert_eq!(key, last),
        other => panic!("expected Busy on {last}, got {other:?}"),
    }
    assert!(
        is_free(&checker, &first).await,
        "a zero wait kept the first key"
    );
    held.release().await.unwrap();
}

/// An acquire dropped while it waits for its second key (a caller's
/// timeout) gives the first key back: another client can take it within
/// 10 s (a background release; generous for a loaded machine).
pub async fn a_cancelled_acquire_leaves_no_key_held<F: Fixture>(fixture: &F) {
    let base = unique_key("multi-cancel");
    let (first, second) = (format!("{base}:1"), format!("{base}:2"));
    let (holder, taker, checker) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let held = Lock::new(&second)
        .with_backend(holder)
        .acquire()
        .await
        .unwrap();
    let lock = multi(&taker, [first.as_str(), second.as_str()]);
    let cancelled = tokio::time::timeout(Duration::from_millis(500), lock.acquire()).await;
    assert!(cancelled.is_err(), "acquired a key someone else holds");
    let mut free = false;
    let until = Instant::now() + Duration::from_secs(10);
    while !free && Instant::now() < until {
        free = is_free(&checker, &first).await;
        if !free {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(free, "the cancelled acquire kept the first key for 10 s");
    held.release().await.unwrap();
}

/// Over alternating clients, each key's fence strictly increases, also
/// when a plain `Lock` on one of the keys takes turns in between.
pub async fn fencing_tokens_strictly_increase_per_key<F: Fixture>(fixture: &F) {
    if !fixture.fencing() {
        return;
    }
    let (a, b) = (unique_key("multi-fence-a"), unique_key("multi-fence-b"));
    let clients = [fixture.backend().await, fixture.backend().await];
    let mut last: [Option<u64>; 2] = [None, None];
    for round in 0..6 {
        let client = &clients[round % 2];
        let guard = multi(client, [b.as_str(), a.as_str()])
            .acquire()
            .await
            .unwrap();
        let fences = guard.fencing_tokens();
        assert_eq!(fences.len(), 2);
        for (i, (key, fence)) in fences.into_iter().enumerate() {
            assert_eq!(key, [&a, &b][i]);
            let fence = fence.expect("a fencing backend gave no fence");
            assert!(
                last[i].is_none_or(|previous| fence > previous),
                "fence of {key} went from {:?} to {fence}",
                last[i]
            );
            last[i] = Some(fence);
        }
        guard.release().await.unwrap();
        // A plain lock on `a` alone advances `a`'s fence only.
        let single = Lock::new(&a)
            .with_backend(client.clone())
            .acquire()
            .await
            .unwrap();
        let fence = single.fencing_token().unwrap();
        assert!(last[0].is_some_and(|previous| fence > previous));
        last[0] = Some(fence);
        single.release().await.unwrap();
    }
}

/// Inside the guard's scope a `Lock` on one of its keys re-enters; outside
/// it the key is held; after the release every key is free.
pub async fn inside_the_scope_each_key_is_reentrant<F: Fixture>(fixture: &F) {
    let (a, b) = (unique_key("multi-scope-a"), unique_key("multi-scope-b"));
    let backend = fixture.backend().await;
    let guard = multi(&backend, [a.as_str(), b.as_str()])
        .acquire()
        .await
        .unwrap();
    assert!(guard.is_held());
    let one = Lock::new(&b).with_backend(backend.clone());
    assert!(one.try_acquire().await.unwrap().is_none());
    let inner = guard
        .scope(one.try_acquire())
        .await
        .unwrap()
        .expect("a key of the guard re-enters inside its scope");
    assert!(inner.is_reentrant());
    drop(inner);
    assert!(
        guard.is_held(),
        "dropping the reentrant guard released a key"
    );
    guard.release().await.unwrap();
    let checker = fixture.backend().await;
    assert!(is_free(&checker, &a).await && is_free(&checker, &b).await);
}

/// No keys, and one bad key among good ones, are typed errors before any
/// key is taken.
pub async fn bad_input_is_rejected<F: Fixture>(fixture: &F) {
    let backend = fixture.backend().await;
    let none: [&str; 0] = [];
    match multi(&backend, none).acquire().await {
        Err(LockError::InvalidOption { reason }) => assert!(reason.contains("at least one key")),
        other => panic!("expected InvalidOption, got {other:?}"),
    }
    let good = unique_key("multi-bad");
    match multi(&backend, [good.as_str(), ""]).try_acquire().await {
        Err(LockError::InvalidKey { .. }) => {}
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    let checker = fixture.backend().await;
    assert!(
        is_free(&checker, &good).await,
        "a good key was taken before the bad one was seen"
    );
}

/// Two multi-key locks over a shared key, `join!`ed in one task (as
/// ordinary code writes it) on one client, and a plain `Lock` of the shared
/// key beside them: a task is not a holder, so the three take turns on the
/// shared key (never two inside at once) and none deadlocks.
pub async fn joined_in_one_task_they_contend<F: Fixture>(fixture: &F) {
    let a = format!("{}:a", unique_key("multi-join"));
    let b = a.replace(":a", ":b");
    let c = a.replace(":a", ":c");
    let backend = fixture.backend().await;
    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    let hold = |held: &AtomicUsize| {
        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now, Ordering::SeqCst);
    };
    let first = async {
        let guard = multi(&backend, [a.as_str(), b.as_str()])
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .expect("[a, b]");
        hold(&inside);
        tokio::time::sleep(Duration::from_millis(50)).await;
        inside.fetch_sub(1, Ordering::SeqCst);
        guard.release().await.expect("release [a, b]");
    };
    let second = async {
        let guard = multi(&backend, [c.as_str(), b.as_str()])
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .expect("[c, b]");
        hold(&inside);
        tokio::time::sleep(Duration::from_millis(50)).await;
        inside.fetch_sub(1, Ordering::SeqCst);
        guard.release().await.expect("release [c, b]");
    };
    let plain = async {
        let guard = Lock::new(b.as_str())
            .with_backend(backend.clone())
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .expect("b alone");
        hold(&inside);
        tokio::time::sleep(Duration::from_millis(50)).await;
        inside.fetch_sub(1, Ordering::SeqCst);
        guard.release().await.expect("release b");
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(first, second, plain)
    })
    .await
    .expect("locks joined in one task deadlocked");
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two holders of the shared key at once in one task"
    );
    for key in [&a, &b, &c] {
        assert!(is_free(&backend, key).await, "{key} left held");
    }
}

/// A multi-key guard taken on a second runtime that then sits idle keeps
/// every key (renewed by dlock's watchdog, not by that runtime); dropped
/// with that runtime, it frees every key within its ttl.
pub async fn a_guard_of_an_idle_runtime_lives_and_ends_with_it<F: Fixture>(fixture: &F) {
    let a = format!("{}:a", unique_key("multi-runtime"));
    let b = a.replace(":a", ":b");
    let ttl = fixture.short_ttl();
    let (mine, other) = (fixture.backend().await, fixture.backend().await);
    let lock = multi(&mine, [a.as_str(), b.as_str()]).ttl(ttl);
    let (guard, idle) =
        crate::ordinary_code::on_a_second_runtime(async move { lock.acquire().await }).await;
    let guard = guard.expect("both keys on the second runtime");
    tokio::time::sleep(ttl * 3 + ttl / 2).await;
    assert!(guard.is_held(), "a key of the idle runtime's guard lapsed");
    for key in [&a, &b] {
        assert!(
            !is_free(&other, key).await,
            "{key} was free under a live guard"
        );
    }
    tokio::task::spawn_blocking(move || {
        drop(idle);
        drop(guard);
    })
    .await
    .unwrap();
    let start = Instant::now();
    let next = multi(&other, [b.as_str(), a.as_str()])
        .wait(ttl * 3 + Duration::from_secs(5))
        .acquire()
        .await
        .expect("a guard dropped with its runtime never freed its keys");
    let took = start.elapsed();
    assert!(
        took <= ttl + Duration::from_secs(2),
        "freed after {took:?} (ttl {ttl:?})"
    );
    next.release().await.unwrap();
}
