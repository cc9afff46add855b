//! The latch's metrics counted exactly: a known sequence of `CountDownLatch`
//! calls on the memory backend and on a real Redis (each registered under a
//! name of its own, its label), read back through `metrics-util`'s
//! debugging recorder: one snapshot, the series of each label checked.

use std::time::Duration;

use dlock::{CountDownLatch, LockError};
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::memory::MemoryFixture;
use dlock_tests::fixtures::redis::RedisFixture;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

/// 2 set, 1 live, 4 count_down (one at zero), 2 count, 2 zero, 1 timeout,
/// 1 cancelled.
async fn known_sequence(fixture: &impl Fixture, label: &str) {
    dlock::registry().register(label, fixture.backend().await);
    let latch = CountDownLatch::new(format!("metrics:{label}"))
        .backend(label)
        .wait(Duration::from_millis(200));
    assert!(latch.try_set_count(2).await.unwrap());
    assert!(!latch.try_set_count(2).await.unwrap());
    latch.count_down().await.unwrap();
    assert_eq!(latch.count().await.unwrap(), 1);
    assert!(matches!(
        latch.wait_zero().await,
        Err(LockError::Timeout { .. })
    ));
    let cut = tokio::time::timeout(Duration::from_millis(20), latch.wait_zero()).await;
    assert!(cut.is_err());
    latch.count_down().await.unwrap();
    latch.wait_zero().await.unwrap();
    latch.count_down().await.unwrap();
    assert_eq!(latch.count().await.unwrap(), 0);
    assert!(latch.try_set_count(1).await.unwrap());
    let waiter = tokio::spawn({
        let latch = latch.clone().wait(Duration::from_secs(10));
        async move { latch.wait_zero().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    latch.count_down().await.unwrap();
    waiter.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latch_metrics_count_a_known_sequence_on_memory_and_redis() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    known_sequence(&MemoryFixture::default(), "latch-memory").await;
    known_sequence(&RedisFixture::single(), "latch-redis").await;
    let series: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (kind, key.name().to_owned(), labels, value)
        })
        .collect();
    let label_of = |labels: &[(String, String)], k: &str| {
        labels
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    for backend in ["latch-memory", "latch-redis"] {
        let calls = |op: &str, outcome: &str| -> u64 {
            series
                .iter()
                .filter(|(kind, name, labels, _)| {
                    *kind == MetricKind::Counter
                        && name == "dlock_latch_total"
                        && label_of(labels, "backend").as_deref() == Some(backend)
                        && label_of(labels, "op").as_deref() == Some(op)
                        && label_of(labels, "outcome").as_deref() == Some(outcome)
                })
                .map(|(_, _, _, v)| match v {
                    DebugValue::Counter(n) => *n,
                    _ => 0,
                })
                .sum()
        };
        assert_eq!(calls("set_count", "set"), 2, "{backend}");
        assert_eq!(calls("set_count", "live"), 1, "{backend}");
        assert_eq!(calls("count_down", "done"), 4, "{backend}");
        assert_eq!(calls("count", "done"), 2, "{backend}");
        assert_eq!(calls("wait_zero", "zero"), 2, "{backend}");
        assert_eq!(calls("wait_zero", "timeout"), 1, "{backend}");
        assert_eq!(calls("wait_zero", "cancelled"), 1, "{backend}");
        let waits: usize = series
            .iter()
            .filter(|(kind, name, labels, _)| {
                *kind == MetricKind::Histogram
                    && name == "dlock_latch_wait_seconds"
                    && label_of(labels, "backend").as_deref() == Some(backend)
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Histogram(h) => h.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(waits, 2, "{backend}: one sample per wait that saw zero");
        let waiting: f64 = series
            .iter()
            .filter(|(kind, name, labels, _)| {
                *kind == MetricKind::Gauge
                    && name == "dlock_latch_waiting"
                    && label_of(labels, "backend").as_deref() == Some(backend)
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Gauge(g) => g.into_inner(),
                _ => f64::NAN,
            })
            .sum();
        assert_eq!(waiting, 0.0, "{backend}: nobody waits at the end");
    }
}
