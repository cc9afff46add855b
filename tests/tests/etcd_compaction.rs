//! `?compaction=` (issue 68): dlock compacts etcd's history when asked, and
//! only then; locks held and waited for across the compactions are not
//! disturbed (no loss, hand-offs on time).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend};
use dlock_tests::fixtures::etcd::EtcdFixture;

/// The history dlock keeps in these tests: short, so that a few periods
/// pass in seconds.
const KEPT: &str = "1s";

/// A client of the test's own, as root where auth is on, to read history.
async fn reader(fixture: &mut EtcdFixture, root: bool) -> etcd_client::Client {
    let endpoints = fixture.cluster_mut().endpoints();
    let options = root.then(|| etcd_client::ConnectOptions::new().with_user("root", "root-pw"));
    etcd_client::Client::connect(endpoints, options)
        .await
        .expect("connect the history reader")
}

/// Whether revision 1 is gone from the history (a read at it answers etcd's
/// `ErrCompacted`).
async fn first_revision_compacted(client: &mut etcd_client::Client) -> bool {
    let at_first = etcd_client::GetOptions::new().with_revision(1);
    match client.kv_client().get("dlock/", Some(at_first)).await {
        Ok(_) => false,
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("compacted"), "a read at revision 1: {text}");
            true
        }
    }
}

/// Lock cycles on `backend` for `run` (so that the revision moves), while
/// `long` is held: answers how many cycles ran.
async fn traffic(backend: &Arc<dyn LockBackend>, run: Duration) -> usize {
    let until = Instant::now() + run;
    let mut cycles = 0;
    while Instant::now() < until {
        let guard = Lock::new(format!("compacted-{}", cycles % 10))
            .with_backend(backend.clone())
            .acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
        cycles += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cycles
}

async fn compacts_and_locks_go_on(mut fixture: EtcdFixture, root: bool) {
    let url = format!("{}?compaction={KEPT}", fixture.url());
    let backend = dlock::connect(&url)
        .await
        .expect("connect with ?compaction=");
    let other = dlock::connect(fixture.url()).await.expect("connect");
    let mut client = reader(&mut fixture, root).await;
    // Held through every compaction, renewed by the watchdog.
    let long = Lock::new("held-across")
        .ttl(Duration::from_secs(2))
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    // A waiter of another backend, queued before the compactions, its watch
    // started in history that is then compacted.
    let waiter = {
        let lock = Lock::new("held-across")
            .wait(Duration::from_secs(60))
            .with_backend(other.clone());
        tokio::spawn(async move { lock.acquire().await })
    };
    let started = Instant::now();
    let mut cycles = 0;
    while !first_revision_compacted(&mut client).await {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no compaction within 20 s of ?compaction={KEPT} ({cycles} lock cycles)"
        );
        cycles += traffic(&backend, Duration::from_millis(500)).await;
    }
    let compacted_after = started.elapsed();
    // A few more periods, compactions included, with traffic.
    cycles += traffic(&backend, Duration::from_secs(3)).await;
    eprintln!(
        "etcd ?compaction={KEPT}: history compacted {compacted_after:?} after the start; {cycles} lock cycles beside it"
    );
    assert!(
        futures_util::FutureExt::now_or_never(long.lost()).is_none(),
        "a lock held across the compactions was reported lost"
    );
    long.ensure().expect("still held");
    let released = Instant::now();
    long.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is granted after the compactions")
        .unwrap()
        .unwrap();
    eprintln!(
        "the waiter queued before the compactions was granted {:?} after the release",
        released.elapsed()
    );
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_when_asked_leaves_locks_and_waiters_alone() {
    compacts_and_locks_go_on(EtcdFixture::single(), false).await;
}

/// The minimal role of the backends guide (readwrite on dlock's prefixes)
/// may compact: etcd 3.4 checks no permission for a compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_works_with_the_minimal_role() {
    compacts_and_locks_go_on(EtcdFixture::restricted(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_compaction_unless_asked() {
    let mut fixture = EtcdFixture::single();
    let backend = dlock::connect(fixture.url()).await.expect("connect");
    let mut client = reader(&mut fixture, false).await;
    let cycles = traffic(&backend, Duration::from_secs(4)).await;
    assert!(
        !first_revision_compacted(&mut client).await,
        "history compacted without ?compaction= ({cycles} cycles)"
    );
}
