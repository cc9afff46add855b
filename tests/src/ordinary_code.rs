//! Conformance cases that try to break exclusion the way ordinary code
//! would: concurrent branches of one task, a second runtime, a guard that
//! outlives its runtime, a release cancelled half-way, a lost guard kept
//! alive. Every backend runs them through
//! [`conformance_suite!`](crate::conformance_suite).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockBackend, LockError, LockGuard};
use tokio::runtime::{Builder, Runtime};

use crate::conformance::{lock, unique_key, Fixture};
use crate::overlap::OverlapDetector;

/// Reentrancy follows the holder's critical section: inside the guard's
/// scope the key re-enters (same lease, same fence), outside it the same
/// code waits as for any other holder.
pub async fn reentrancy_follows_the_holders_scope<F: Fixture>(fixture: &F) {
    let key = unique_key("reentrant");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let outer = lock(&a, &key).acquire().await.unwrap();
    let inner = outer
        .scope(lock(&a, &key).wait(Duration::ZERO).acquire())
        .await
        .expect("an acquire inside the holder's scope re-enters");
    assert!(inner.is_reentrant());
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert_eq!(inner.token(), outer.token());
    drop(inner);
    assert!(
        outer.is_held(),
        "dropping the inner guard released the lease"
    );
    // The same task, outside the scope: not reentrant, the key is held.
    assert!(lock(&a, &key).try_acquire().await.unwrap().is_none());
    let err = lock(&a, &key)
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(lock(&b, &key).try_acquire().await.unwrap().is_none());
    outer.release().await.unwrap();
    assert!(lock(&b, &key).try_acquire().await.unwrap().is_some());
}

/// Holds `key` on `backend` for a moment with `detector` watching, and
/// returns the fence it held.
async fn hold_once(
    backend: &Arc<dyn LockBackend>,
    key: &str,
    detector: &OverlapDetector,
) -> Option<u64> {
    let guard = lock(backend, key)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("acquire in a concurrent branch");
    detector.enter();
    tokio::time::sleep(Duration::from_millis(30)).await;
    detector.leave();
    let fence = guard.fencing_token();
    guard
        .release()
        .await
        .expect("release in a concurrent branch");
    fence
}

/// `join!` and `select!` branches of one task are not nested in each other:
/// they contend like separate tasks, one holder at a time.
pub async fn concurrent_branches_of_one_task_contend<F: Fixture>(fixture: &F) {
    let key = unique_key("branches");
    let a = fixture.backend().await;
    let detector = OverlapDetector::default();
    let fences = tokio::join!(
        hold_once(&a, &key, &detector),
        hold_once(&a, &key, &detector),
        hold_once(&a, &key, &detector),
    );
    assert_eq!(
        detector.overlaps(),
        0,
        "two join! branches held the key at once"
    );
    if fixture.fencing() {
        let mut fences = [fences.0, fences.1, fences.2].map(|f| f.expect("a fence"));
        fences.sort_unstable();
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "join! branches shared a fence: {fences:?}"
        );
    }

    // select!: while one branch holds the key, another branch of the same
    // task finds it busy.
    let holder = async {
        let guard = lock(&a, &key).acquire().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(guard);
    };
    let other = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        lock(&a, &key).wait(Duration::ZERO).acquire().await
    };
    tokio::select! {
        () = holder => panic!("the holder branch should still be sleeping"),
        attempt = other => assert!(
            matches!(attempt, Err(LockError::Busy { .. })),
            "a select! branch re-entered its sibling's lock: {attempt:?}"
        ),
    }
}

/// A lost guard that is kept alive gives up this process's turn on the key:
/// the same task (and any other) can take the key again at once.
pub async fn reacquire_after_loss_while_the_lost_guard_lives<F: Fixture>(fixture: &F) {
    let key = unique_key("relost");
    let ttl = fixture.short_ttl();
    let a = fixture.backend().await;
    let lost_guard = lock(&a, &key).ttl(ttl).acquire().await.unwrap();
    fixture.steal(&key).await;
    tokio::time::timeout(ttl * 2 + Duration::from_secs(2), lost_guard.lost())
        .await
        .expect("lost() did not fire after the key was removed");
    // The lost guard is still alive. With a wait and without one.
    let again = lock(&a, &key)
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect("re-acquiring a key whose guard was lost");
    assert!(!again.is_reentrant(), "re-entered a lost lease");
    again.release().await.unwrap();
    let unbounded = tokio::time::timeout(Duration::from_secs(5), lock(&a, &key).acquire())
        .await
        .expect("an acquire without a wait hung behind a lost guard")
        .unwrap();
    unbounded.release().await.unwrap();
    drop(lost_guard);
}

/// A current-thread runtime on a thread of its own, for the cases that need
/// a second runtime.
fn second_runtime() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

/// Drops a runtime off the async threads (dropping one there panics).
async fn drop_runtime(runtime: Runtime) {
    tokio::task::spawn_blocking(move || drop(runtime))
        .await
        .unwrap();
}

/// Runs `work` on a second current-thread runtime that is not driven once
/// `work` returns; gives back what it made and the runtime.
pub(crate) async fn on_a_second_runtime<T, W>(work: W) -> (T, Runtime)
where
    T: Send + 'static,
    W: std::future::Future<Output = T> + Send + 'static,
{
    let runtime = second_runtime();
    let handle = runtime.handle().clone();
    let made = tokio::task::spawn_blocking(move || handle.block_on(work))
        .await
        .unwrap();
    (made, runtime)
}

/// A lease taken on the test's runtime is renewed while the backend's first
/// lease came from a second runtime that now sits idle.
pub async fn a_lease_of_a_second_runtime_is_renewed<F: Fixture>(fixture: &F) {
    let key = unique_key("runtimes");
    let ttl = fixture.short_ttl();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let idle = second_runtime();
    let first = {
        let (a, key) = (a.clone(), format!("{key}:first"));
        let handle = idle.handle().clone();
        tokio::task::spawn_blocking(move || handle.block_on(lock(&a, &key).ttl(ttl).acquire()))
            .await
            .unwrap()
            .expect("acquire on the second runtime")
    };
    // `idle` is not driven from here on.
    let main = lock(&a, &key).ttl(ttl).acquire().await.unwrap();
    tokio::time::sleep(ttl * 3 + ttl / 2).await;
    assert!(main.is_held(), "a lease of the main runtime lapsed");
    assert!(first.is_held(), "a lease of the idle runtime lapsed");
    assert!(
        lock(&b, &key).try_acquire().await.unwrap().is_none(),
        "another client took a key whose holder still believes it holds it"
    );
    main.release().await.unwrap();
    drop(first);
    drop_runtime(idle).await;
}

/// A guard that goes down with its runtime (as a `#[tokio::test]`'s does)
/// frees the key within its ttl, also where the backend's connection and
/// session live on in another runtime.
pub async fn a_guard_dropped_with_its_runtime_frees_the_key<F: Fixture>(fixture: &F) {
    let ttl = fixture.short_ttl();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    // Keeps the backend's session busy, as the other guards of a service do.
    // A wait on each take: without one an acquisition is a single attempt,
    // and one Redlock round (a 50 ms limit per master) on a loaded machine
    // can miss its quorum (`Quorum { reached: 1, needed: 3 }` in CI); what is
    // tested here is the drop, not one round's luck.
    let take_wait = ttl * 3 + Duration::from_secs(5);
    let neighbour = lock(&a, &unique_key("neighbour"))
        .ttl(ttl)
        .wait(take_wait)
        .acquire()
        .await
        .unwrap();
    for dropped_in_shutdown in [true, false] {
        let key = unique_key("runtime-end");
        let guard_key = key.clone();
        let backend = a.clone();
        tokio::task::spawn_blocking(move || {
            let runtime = second_runtime();
            let guard: LockGuard = runtime
                .block_on(
                    lock(&backend, &guard_key)
                        .ttl(ttl)
                        .wait(take_wait)
                        .acquire(),
                )
                .expect("acquire on the short-lived runtime");
            if dropped_in_shutdown {
                // The guard lives in a task that the shutdown drops.
                runtime.spawn(async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                });
                drop(runtime);
            } else {
                drop(runtime);
                drop(guard);
            }
        })
        .await
        .unwrap();
        let start = Instant::now();
        let next = lock(&b, &key)
            .wait(ttl * 3 + Duration::from_secs(5))
            .acquire()
            .await
            .expect("the key of a guard dropped with its runtime was never freed");
        let took = start.elapsed();
        assert!(
            took <= ttl + Duration::from_secs(2),
            "freed after {took:?} (ttl {ttl:?}, dropped in shutdown: {dropped_in_shutdown})"
        );
        next.release().await.unwrap();
    }
    neighbour.release().await.unwrap();
}

/// A release cancelled right after its first poll (a caller's `timeout` or
/// `select!` around the end of a critical section) never lets two holders
/// in: the next local waiter and another client take turns, and whoever
/// holds the key really holds it on the server.
pub async fn cancelled_release_never_gives_two_holders<F: Fixture>(fixture: &F) {
    const ROUNDS: usize = 5;
    let key = unique_key("cancelled-release");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let detector = Arc::new(OverlapDetector::default());
    for _ in 0..ROUNDS {
        let held = lock(&a, &key).acquire().await.unwrap();
        let local_waiter = tokio::spawn(take_turn(a.clone(), key.clone(), detector.clone()));
        let remote = tokio::spawn(take_turn(b.clone(), key.clone(), detector.clone()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Polled once, then dropped: the release finishes in the background.
        let _ = tokio::time::timeout(Duration::ZERO, held.release()).await;
        for task in [local_waiter, remote] {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("a contender never got the key")
                .unwrap();
        }
    }
    assert_eq!(
        detector.overlaps(),
        0,
        "two holders after a cancelled release"
    );
}

/// Takes `key`, checks it is still held after a moment inside, and gives it
/// back.
async fn take_turn(backend: Arc<dyn LockBackend>, key: String, detector: Arc<OverlapDetector>) {
    let guard = lock(&backend, &key)
        .wait(Duration::from_secs(25))
        .acquire()
        .await
        .expect("acquire after a cancelled release");
    detector.enter();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A holder whose key the server no longer has learns it at its next
    // renewal at the latest; a holder that the server backs is still held.
    let held_throughout = guard.is_held();
    detector.leave();
    assert!(
        held_throughout,
        "a holder of {key} lost its key while inside"
    );
    guard
        .release()
        .await
        .expect("release after a cancelled release");
}

/// A synchronous program's pattern: one current-thread runtime connects the
/// backend and takes a lease, then sits idle (not driven) while its thread
/// does blocking work. The backend's connections and sessions must not live
/// on that runtime: renewal keeps the key for three ttls, and another
/// client is kept out.
pub async fn a_backend_connected_on_an_idle_runtime_keeps_renewing<F: Fixture>(fixture: &F) {
    let key = unique_key("idle-connect");
    let ttl = fixture.short_ttl();
    let other = fixture.backend().await;
    // The test's own runtime is a multi-thread one: `block_in_place` lets
    // this thread block and run a runtime of its own.
    let (idle, guard) = tokio::task::block_in_place(|| {
        let idle = second_runtime();
        let backend = idle.block_on(fixture.backend());
        let guard = idle
            .block_on(lock(&backend, &key).ttl(ttl).acquire())
            .expect("acquire on the connecting runtime");
        // Synchronous work; `idle` is not driven meanwhile.
        std::thread::sleep(ttl * 3);
        (idle, guard)
    });
    assert!(
        guard.is_held(),
        "the lease lapsed while the runtime that connected the backend was idle"
    );
    assert!(
        lock(&other, &key).try_acquire().await.unwrap().is_none(),
        "another client took a key whose holder still believes it holds it"
    );
    tokio::task::block_in_place(|| {
        idle.block_on(guard.release())
            .expect("release on the connecting runtime");
        drop(idle);
    });
    let next = lock(&other, &key)
        .try_acquire()
        .await
        .unwrap()
        .expect("the key is free after the release");
    next.release().await.unwrap();
}
