//! The metrics an operator scrapes, counted exactly: a known sequence of
//! acquisitions (2 acquired, 1 reentered, 1 busy, 1 timeout, 1 lost by
//! deleting the lease behind the guard's back) on the memory backend and on
//! a real Redis, read back through `metrics-util`'s debugging recorder; and
//! one grant answered after its deadline (a stale grant given back); and
//! the election series of two terms (one resigned, one lost); and a
//! barrier round (two members in, a lone enter timed out, two leaves).
//!
//! The recorder is global (the watchdog records from dlock's own thread) and
//! its snapshot resets every series, so one test runs the sequence on each
//! backend (registered under a name of its own), takes one snapshot, and
//! checks the series labelled with each name.

use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{Barrier, Election, Lock, LockError, MultiLock, RwLock, Semaphore};
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::memory::MemoryFixture;
use dlock_tests::fixtures::redis::RedisFixture;
use dlock_tests::late_answer;
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::redis::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// One series read back: its name, labels and value.
struct Series {
    kind: MetricKind,
    name: String,
    labels: Vec<(String, String)>,
    value: DebugValue,
}

impl Series {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every series of one snapshot.
fn read(snapshotter: &Snapshotter) -> Vec<Series> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            Series {
                kind,
                name: key.name().to_owned(),
                labels: key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                value,
            }
        })
        .collect()
}

fn counter(series: &[&Series], name: &str, label: (&str, &str)) -> u64 {
    series
        .iter()
        .filter(|s| s.kind == MetricKind::Counter && s.name == name)
        .filter(|s| s.label(label.0) == Some(label.1))
        .map(|s| match s.value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

fn gauges(series: &[&Series], name: &str) -> Vec<f64> {
    series
        .iter()
        .filter(|s| s.kind == MetricKind::Gauge && s.name == name)
        .map(|s| match &s.value {
            DebugValue::Gauge(v) => v.into_inner(),
            _ => f64::NAN,
        })
        .collect()
}

fn histogram_count(series: &[&Series], name: &str) -> usize {
    series
        .iter()
        .filter(|s| s.kind == MetricKind::Histogram && s.name == name)
        .map(|s| match &s.value {
            DebugValue::Histogram(values) => values.len(),
            _ => 0,
        })
        .sum()
}

/// Runs the known sequence against `fixture`'s backend registered as `name`.
async fn known_sequence<F: Fixture>(fixture: &F, name: &str) {
    dlock::registry().register(name, fixture.backend().await);
    let key = format!("observed:{name}");
    let lock = Lock::new(key.clone()).backend(name);

    let held = lock.acquire().await.unwrap(); // acquired
    let inner = held.scope(lock.acquire()).await.unwrap(); // reentered
    assert!(inner.is_reentrant());
    drop(inner);
    let busy = tokio::spawn({
        let lock = lock.clone().wait(Duration::ZERO);
        async move { lock.acquire().await }
    });
    assert!(matches!(busy.await.unwrap(), Err(LockError::Busy { .. })));
    let timeout = tokio::spawn({
        let lock = lock.clone().wait(Duration::from_millis(200));
        async move { lock.acquire().await }
    });
    assert!(matches!(
        timeout.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    held.release().await.unwrap();

    let lost_key = format!("observed-lost:{name}");
    let ttl = fixture.short_ttl();
    let doomed = Lock::new(lost_key.clone())
        .backend(name)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap(); // acquired
    fixture.steal(&lost_key).await;
    tokio::time::timeout(ttl * 2 + Duration::from_secs(2), doomed.lost())
        .await
        .expect("lost() fired");
    drop(doomed);

    // One read and one write lease: kinds `read` and `write`.
    let rw = RwLock::new(format!("observed-rw:{name}")).backend(name);
    rw.read().await.unwrap().release().await.unwrap(); // acquired
    rw.write().await.unwrap().release().await.unwrap(); // acquired
                                                        // Two keys at once: one acquisition per key, also when a single Redis
                                                        // server takes both in one script.
    MultiLock::new([format!("observed-a:{name}"), format!("observed-b:{name}")])
        .backend(name)
        .acquire()
        .await
        .unwrap() // acquired, twice
        .release()
        .await
        .unwrap();
    // Two permits as one, and one read of the free count: kind `permit`,
    // op `available`.
    let slots = Semaphore::new(format!("observed-permits:{name}"), 3).backend(name);
    let two = slots.acquire_many(2).await.unwrap(); // acquired
    assert_eq!(slots.available().await.unwrap(), 1);
    // Its holders read once, and one listing: ops `inspect`, `list_semaphores`.
    assert_eq!(slots.inspect().await.unwrap().held(), 2);
    let backend = dlock::registry().get(name).unwrap();
    let listed = dlock::list_semaphores(&*backend, "observed-permits:").await;
    assert_eq!(listed.unwrap().len(), 1);
    two.release().await.unwrap();
    dlock::registry().unregister(name);
}

/// Checks the series of the backend registered as `name` after the sequence.
fn check(all: &[Series], name: &str) {
    let series: Vec<&Series> = all
        .iter()
        .filter(|s| s.label("backend") == Some(name))
        .collect();
    let outcome = |o| counter(&series, "dlock_acquire_total", ("outcome", o));
    assert_eq!(outcome("acquired"), 7, "{name}");
    assert_eq!(outcome("reentered"), 1, "{name}");
    assert_eq!(outcome("busy"), 1, "{name}");
    assert_eq!(outcome("timeout"), 1, "{name}");
    assert_eq!(outcome("error") + outcome("cancelled"), 0, "{name}");
    assert_eq!(
        counter(&series, "dlock_acquire_total", ("kind", "lock")),
        7,
        "{name}"
    );
    for side in ["read", "write", "permit"] {
        let taken = counter(&series, "dlock_acquire_total", ("kind", side));
        assert_eq!(taken, 1, "{name}: {side}");
    }
    let available = counter(&series, "dlock_operations_total", ("op", "available"));
    assert_eq!(available, 1, "{name}: one read of the free count");
    let op = |op| counter(&series, "dlock_operations_total", ("op", op));
    assert_eq!(op("inspect"), 1, "{name}: one semaphore inspect");
    // A listing is labelled by the backend's scheme, as `list_locks` is.
    let scheme = name.trim_start_matches("metrics-");
    let by_scheme: Vec<&Series> = all
        .iter()
        .filter(|s| s.label("backend") == Some(scheme))
        .collect();
    let listings = counter(
        &by_scheme,
        "dlock_operations_total",
        ("op", "list_semaphores"),
    );
    assert_eq!(listings, 1, "{name}: one semaphore listing");
    let lost: u64 = [
        "refused",
        "deleted",
        "session_expired",
        "unreachable",
        "expired",
    ]
    .iter()
    .map(|r| counter(&series, "dlock_lost_total", ("reason", r)))
    .sum();
    assert_eq!(lost, 1, "{name}: one lease was lost");
    let renewals: u64 = ["renewed", "refused", "failed", "timeout"]
        .iter()
        .map(|o| counter(&series, "dlock_renew_total", ("outcome", o)))
        .sum();
    assert!(renewals >= 1, "{name}: no renewal counted");
    assert_eq!(
        histogram_count(&series, "dlock_acquire_wait_seconds"),
        8,
        "{name}"
    );
    assert_eq!(histogram_count(&series, "dlock_hold_seconds"), 7, "{name}");
    assert!(
        histogram_count(&series, "dlock_renew_seconds") >= 1,
        "{name}"
    );
    for gauge in ["dlock_held_leases", "dlock_waiting"] {
        let values = gauges(&series, gauge);
        assert!(!values.is_empty(), "{name}: {gauge} was never set");
        assert!(
            values.iter().all(|v| *v == 0.0),
            "{name}: {gauge} did not return to 0: {values:?}"
        );
    }
}

/// Two elections won on the backend registered as `name`: the first
/// resigned, the second lost (its lease deleted). Returns the second term.
async fn election_sequence<F: Fixture>(fixture: &F, name: &str) -> u64 {
    dlock::registry().register(name, fixture.backend().await);
    let election = Election::new("scheduler").backend(name);
    election
        .campaign("a")
        .await
        .unwrap()
        .resign()
        .await
        .unwrap();
    let doomed = election
        .clone()
        .ttl(fixture.short_ttl())
        .campaign("b")
        .await
        .unwrap();
    fixture.steal("scheduler").await;
    tokio::time::timeout(Duration::from_secs(10), doomed.lost())
        .await
        .expect("lost() fired");
    let term = doomed.term();
    drop(doomed);
    // The loss is reported by a task of dlock's runtime; give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    dlock::registry().unregister(name);
    term
}

/// Checks the election series of the backend registered as `name`.
fn check_election(all: &[Series], name: &str, term: u64) {
    let series: Vec<&Series> = all
        .iter()
        .filter(|s| s.label("backend") == Some(name) && s.label("election") == Some("scheduler"))
        .collect();
    assert_eq!(
        counter(&series, "dlock_elections_total", ("election", "scheduler")),
        2,
        "{name}"
    );
    assert_eq!(
        counter(&series, "dlock_leader_term", ("election", "scheduler")),
        term,
        "{name}"
    );
    assert_eq!(
        gauges(&series, "dlock_leader"),
        vec![0.0],
        "{name}: dlock_leader after the loss"
    );
}

/// A barrier round on the backend registered as `name`: two members enter
/// together, a lone member of the next round times out, the two leave.
async fn barrier_sequence<F: Fixture>(fixture: &F, name: &str) {
    dlock::registry().register(name, fixture.backend().await);
    let barrier = Barrier::new("batch", 2).backend(name);
    let (a, b) = tokio::join!(barrier.enter(), barrier.enter());
    let (a, b) = (a.unwrap(), b.unwrap());
    let (la, lb) = tokio::join!(a.leave(), b.leave());
    la.unwrap();
    lb.unwrap();
    let lone = barrier
        .clone()
        .wait(Duration::from_millis(100))
        .enter()
        .await;
    assert!(matches!(lone, Err(LockError::Timeout { .. })), "{lone:?}");
    dlock::registry().unregister(name);
}

/// Checks the barrier series of the backend registered as `name`.
fn check_barrier(all: &[Series], name: &str) {
    let series: Vec<&Series> = all
        .iter()
        .filter(|s| s.label("backend") == Some(name))
        .collect();
    let barrier: Vec<&Series> = series
        .iter()
        .copied()
        .filter(|s| s.label("kind") == Some("barrier"))
        .collect();
    assert_eq!(
        counter(&barrier, "dlock_acquire_total", ("outcome", "acquired")),
        2,
        "{name}: members entered"
    );
    assert_eq!(
        counter(&barrier, "dlock_acquire_total", ("outcome", "timeout")),
        1,
        "{name}: the lone enter"
    );
    assert_eq!(histogram_count(&barrier, "dlock_hold_seconds"), 2, "{name}");
    assert_eq!(
        counter(&series, "dlock_operations_total", ("op", "leave")),
        2,
        "{name}: leaves"
    );
    let left: Vec<&Series> = series
        .iter()
        .copied()
        .filter(|s| s.label("op") == Some("leave"))
        .collect();
    assert_eq!(
        counter(&left, "dlock_operations_total", ("outcome", "left")),
        2,
        "{name}"
    );
}

/// A grant answered after its deadline (Redis behind a proxy that delays
/// answers past the ttl), registered as `name`: one `try_acquire`, given
/// back, `busy`.
async fn a_late_grant(name: &str) -> RedisServer {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let backend = RedisBackend::connect(&format!("redis://{}", proxy.addr()))
        .await
        .expect("connect through the proxy");
    dlock::registry().register(name, std::sync::Arc::new(backend));
    proxy.delay_replies(late_answer::DELAY);
    let late = Lock::new(format!("observed-late:{name}"))
        .backend(name)
        .ttl(late_answer::TTL)
        .try_acquire()
        .await
        .expect("an answer, if late");
    assert!(late.is_none(), "a late grant was handed over");
    proxy.pass();
    dlock::registry().unregister(name);
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_counts_a_known_sequence_on_memory_and_redis() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    known_sequence(&MemoryFixture::default(), "metrics-memory").await;
    known_sequence(&RedisFixture::single(), "metrics-redis").await;
    let _server = a_late_grant("metrics-late").await;
    let memory_term = election_sequence(&MemoryFixture::default(), "elect-memory").await;
    let redis_term = election_sequence(&RedisFixture::single(), "elect-redis").await;
    barrier_sequence(&MemoryFixture::default(), "barrier-memory").await;
    let all = read(&snapshotter);
    check_barrier(&all, "barrier-memory");
    check_election(&all, "elect-memory", memory_term);
    check_election(&all, "elect-redis", redis_term);
    check(&all, "metrics-memory");
    check(&all, "metrics-redis");
    for name in ["metrics-memory", "metrics-redis"] {
        let series: Vec<&Series> = all
            .iter()
            .filter(|s| s.label("backend") == Some(name))
            .collect();
        let stale = counter(&series, "dlock_stale_grants_total", ("kind", "lock"));
        assert_eq!(stale, 0, "{name}: no grant came late");
    }
    let late: Vec<&Series> = all
        .iter()
        .filter(|s| s.label("backend") == Some("metrics-late"))
        .collect();
    assert_eq!(
        counter(&late, "dlock_stale_grants_total", ("reason", "late_answer")),
        1,
        "the late grant was not counted"
    );
    assert_eq!(
        counter(&late, "dlock_acquire_total", ("outcome", "busy")),
        1,
        "the late grant's try_acquire is not busy"
    );
    assert_eq!(
        counter(&late, "dlock_acquire_total", ("outcome", "acquired")),
        0
    );
    // Keys are unbounded: never a label.
    assert!(all
        .iter()
        .all(|s| s.labels.iter().all(|(_, v)| !v.contains("observed"))));
}
