//! Guards and backends whose runtime ended.

use super::*;

/// Runs `work` in a thread of its own, on a current-thread runtime it is
/// given to end (as a `#[tokio::test]` helper or a `block_on` in a thread
/// makes one), and answers what `work` answers (bounded: 30 s).
async fn on_a_helper_runtime<T: Send + 'static>(
    work: impl FnOnce(tokio::runtime::Runtime) -> T + Send + 'static,
) -> T {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a helper runtime");
        let _ = done_tx.send(work(rt));
    });
    tokio::time::timeout(Duration::from_secs(30), done_rx)
        .await
        .expect("the helper runtime did not finish within 30 s")
        .expect("the helper thread panicked")
}

/// A guard taken on a short-lived current-thread runtime (as a
/// `#[tokio::test]` helper or a `block_on` in a thread makes one) and dropped
/// as that runtime ends frees its key within the ttl, though the backend and
/// its session live on (on dlock's runtime): one guard dies with a task of
/// that runtime at its shutdown, the other is dropped after the runtime is
/// gone. Neither can run its release on that runtime; the node must still go
/// when the lease runs out, as dlock::guide::guarantees promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_dropped_with_their_runtime_free_the_key_within_the_ttl() {
    let fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    let other = backend(&fixture).await;
    let ttl = Duration::from_secs(3);
    let (in_task, after) = ("dead-runtime:task", "dead-runtime:after");
    let (lock_in_task, lock_after) = (lock(&b, in_task).ttl(ttl), lock(&b, after).ttl(ttl));
    let dropped_at = on_a_helper_runtime(move |rt| {
        let (one, two) = rt.block_on(async {
            let one = lock_in_task
                .acquire()
                .await
                .expect("acquire on the helper runtime");
            let two = lock_after
                .acquire()
                .await
                .expect("acquire on the helper runtime");
            (one, two)
        });
        // Dropped by the runtime's shutdown, with the task that holds it.
        rt.spawn(async move {
            let _held = one;
            std::future::pending::<()>().await
        });
        drop(rt);
        // Dropped with no runtime left at all.
        drop(two);
        Instant::now()
    })
    .await;

    let limit = Duration::from_secs(6);
    for key in [in_task, after] {
        let got = lock(&other, key)
            .wait(limit.saturating_sub(dropped_at.elapsed()))
            .acquire()
            .await;
        let took = dropped_at.elapsed();
        let guard = match got {
            Ok(g) => g,
            Err(e) => {
                let queue = fixture.contenders(key).await;
                panic!("{key}: another client could not get the key {took:?} after its guard was dropped with its runtime (ttl {ttl:?}): {e}; queue {queue:?}; holder backend {b:?}")
            }
        };
        guard.release().await.unwrap();
    }
}

/// A backend connected on a runtime that then ends (a backend made in one
/// `#[tokio::test]` and kept in a static for the next) keeps its session,
/// which runs on dlock's own runtime: a lease taken on the ended runtime is
/// still renewed past the session timeout, and the next acquisition, on
/// another runtime, uses the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_whose_runtime_ended_keeps_its_session() {
    let fixture = ZkFixture::start().await;
    let url = fixture.url().to_owned();
    let key = "orphaned-session";
    let (orphaned, guard) = on_a_helper_runtime(move |rt| {
        let (backend, guard) = rt.block_on(async {
            let backend = Arc::new(ZooKeeperBackend::connect(&url).await.expect("connect"));
            let guard = lock(&backend, key).acquire().await.expect("acquire");
            (backend, guard)
        });
        drop(rt);
        (backend, guard)
    })
    .await;
    let session = orphaned.client().expect("a live session").session_id();

    // Long enough for the server to expire a session nobody kept alive.
    tokio::time::sleep(SESSION_TIMEOUT + Duration::from_secs(1)).await;
    assert!(
        guard.is_held(),
        "the lease of the ended runtime lapsed: its session died with that runtime"
    );
    let other = backend(&fixture).await;
    assert!(
        lock(&other, key).try_acquire().await.unwrap().is_none(),
        "another client took a key whose holder still believes it holds it"
    );
    let fresh = lock(&orphaned, "fresh")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire on the backend of the ended runtime");
    assert_eq!(
        orphaned.client().expect("a live session").session_id(),
        session,
        "the backend opened a new session"
    );
    fresh.release().await.unwrap();
    guard.release().await.unwrap();
    let freed = lock(&other, key)
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the release");
    freed.release().await.unwrap();
}
