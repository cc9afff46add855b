//! The segmented-lock suite. Segments are ordinary locks, so every backend
//! can run it; backends opt in with
//! [`segments_suite!`](crate::segments_suite).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockBackend, LockError, SegmentedLock};

use crate::conformance::{unique_key, Fixture};
use crate::overlap::OverlapDetector;

/// Expands to one `#[tokio::test]` per segmented-lock case.
#[macro_export]
macro_rules! segments_suite {
    ($fixture:expr) => {
        $crate::segments_suite!(@cases $fixture;
            no_two_holders_on_one_segment_and_all_are_used,
            waits_when_all_are_busy_and_wakes_when_any_frees,
            a_waiter_freed_by_two_releases_keeps_one_segment,
            try_acquire_is_none_when_all_are_held,
            bad_input_is_rejected,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod segments {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture;
                    $crate::segments::$case(&fixture).await;
                }
            )*
        }
    };
}

fn segmented(backend: &Arc<dyn LockBackend>, key: &str, segments: usize) -> SegmentedLock {
    SegmentedLock::new(key, segments).with_backend(backend.clone())
}

/// 32 tasks on 4 clients × 50 cycles on 4 segments: one overlap detector per
/// segment sees no overlap, and every segment served critical sections.
pub async fn no_two_holders_on_one_segment_and_all_are_used<F: Fixture>(fixture: &F) {
    const SEGMENTS: usize = 4;
    const CLIENTS: usize = 4;
    const TASKS_PER_CLIENT: usize = 8;
    const CYCLES: usize = 50;
    let key = unique_key("segments-load");
    let detectors: Arc<Vec<OverlapDetector>> =
        Arc::new((0..SEGMENTS).map(|_| OverlapDetector::default()).collect());
    let used: Arc<Vec<AtomicUsize>> =
        Arc::new((0..SEGMENTS).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let backend = fixture.backend().await;
        for _ in 0..TASKS_PER_CLIENT {
            let lock = segmented(&backend, &key, SEGMENTS).wait(Duration::from_secs(60));
            let (detectors, used) = (detectors.clone(), used.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..CYCLES {
                    let guard = lock.acquire().await.expect("acquire a segment");
                    let segment = guard.segment().expect("a segment guard names its segment");
                    assert_eq!(guard.key(), lock.segment_key(segment));
                    detectors[segment].enter();
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    detectors[segment].leave();
                    used[segment].fetch_add(1, Ordering::SeqCst);
                    guard.release().await.expect("release a segment");
                }
            }));
        }
    }
    tokio::time::timeout(Duration::from_secs(240), async {
        for task in tasks {
            task.await.expect("a contending task panicked");
        }
    })
    .await
    .expect("the segment load did not finish within 240 s");
    for (i, detector) in detectors.iter().enumerate() {
        assert_eq!(
            detector.overlaps(),
            0,
            "two holders overlapped on segment {i}"
        );
    }
    let counts: Vec<usize> = used.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    assert_eq!(
        counts.iter().sum::<usize>(),
        CLIENTS * TASKS_PER_CLIENT * CYCLES
    );
    assert!(
        counts.iter().all(|c| *c > 0),
        "a segment was never used: {counts:?}"
    );
}

/// With every segment held by another client, `acquire` waits, and it is
/// woken by the release of any one segment, long before the 30 s ttl.
pub async fn waits_when_all_are_busy_and_wakes_when_any_frees<F: Fixture>(fixture: &F) {
    const SEGMENTS: usize = 3;
    let key = unique_key("segments-wait");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let holders = segmented(&a, &key, SEGMENTS).ttl(Duration::from_secs(30));
    let mut held = Vec::new();
    for i in 0..SEGMENTS {
        held.push(holders.acquire_segment(i).await.unwrap());
    }
    let waiter = segmented(&b, &key, SEGMENTS).wait(Duration::from_secs(10));
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "acquired while every segment was held"
    );
    // Free the middle segment: the waiter must get exactly that one.
    let freed_at = Instant::now();
    held.remove(1).release().await.unwrap();
    let (got_at, guard) = waiting
        .await
        .unwrap()
        .expect("the waiter never got a segment");
    let wake = got_at - freed_at;
    assert_eq!(guard.segment(), Some(1));
    assert!(
        wake < Duration::from_secs(1),
        "woke {wake:?} after the release; waiting must be woken, not wait for expiry"
    );
    println!("segment waiter woke {wake:?} after the release");
    guard.release().await.unwrap();
}

/// The wait-on-all path: when two segments free at once, the waiter takes
/// one and the wait on the other leaves nothing held (10 rounds).
pub async fn a_waiter_freed_by_two_releases_keeps_one_segment<F: Fixture>(fixture: &F) {
    const SEGMENTS: usize = 3;
    let key = unique_key("segments-two-free");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let holders = segmented(&a, &key, SEGMENTS)
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(5));
    for round in 0..10 {
        let mut held: Vec<_> = Vec::new();
        for i in 0..SEGMENTS {
            held.push(holders.acquire_segment(i).await.unwrap());
        }
        let waiter = segmented(&b, &key, SEGMENTS).wait(Duration::from_secs(10));
        let waiting = tokio::spawn(async move { waiter.acquire().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (first, second) = (held.remove(0), held.remove(0));
        let _ = tokio::join!(first.release(), second.release());
        let won = waiting
            .await
            .unwrap()
            .expect("the waiter never got a segment");
        let won_segment = won.segment().unwrap();
        assert!(won_segment < 2, "round {round}: won segment {won_segment}");
        let other = 1 - won_segment;
        let again = holders
            .acquire_segment(other)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the waiter kept segment {other} too: {e}"));
        drop((again, won, held));
        // Give the background releases of the dropped guards a moment.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn try_acquire_is_none_when_all_are_held<F: Fixture>(fixture: &F) {
    let key = unique_key("segments-try");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let lock = segmented(&a, &key, 2);
    let first = lock.acquire_segment(0).await.unwrap();
    let other = segmented(&b, &key, 2);
    let second = other
        .try_acquire()
        .await
        .unwrap()
        .expect("segment 1 is free");
    assert_eq!(second.segment(), Some(1));
    // Another task: this one would get its own segment back (reentrancy).
    let third = segmented(&b, &key, 2);
    let attempt = tokio::spawn(async move { third.try_acquire().await.map(|g| g.is_some()) });
    assert!(
        !attempt.await.unwrap().unwrap(),
        "a third holder got a segment"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
}

pub async fn bad_input_is_rejected<F: Fixture>(fixture: &F) {
    let a = fixture.backend().await;
    let err = segmented(&a, "fine", 0).acquire().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    let err = segmented(&a, "fine", 2)
        .acquire_segment(2)
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    let err = segmented(&a, "", 2).acquire().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
}
