//! Reentrancy follows the holder's critical section, not the task: each
//! shape in which ordinary code calls a locked function concurrently or
//! nested, on the memory backend.
//!
//! Each test registers its own backend under its own name, so tests running
//! in parallel never share a lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::backends::memory::MemoryBackend;
use dlock::{distributed_lock, Lock, LockError, LockGuard};
use futures_util::stream::{self, FuturesUnordered, StreamExt};

/// Counts the bodies inside at once; more than one is an overlap.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Inside {
    async fn visit(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(40)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

fn register(name: &str) -> Arc<MemoryBackend> {
    let backend = Arc::new(MemoryBackend::new());
    dlock::registry().register(name, backend.clone());
    backend
}

#[distributed_lock(key = "order:{id}", wait = "10s", backend = "join-top")]
async fn pay_top(id: u64, inside: &Inside, guard: &LockGuard) -> Result<bool, LockError> {
    inside.visit().await;
    Ok(guard.is_reentrant())
}

#[tokio::test]
async fn join_at_top_level_runs_the_bodies_one_at_a_time() {
    register("join-top");
    let inside = Inside::default();
    let (a, b, c) = tokio::join!(
        pay_top(42, &inside),
        pay_top(42, &inside),
        pay_top(42, &inside)
    );
    assert_eq!(inside.most(), 1, "join! ran two bodies of pay(42) at once");
    assert_eq!([a.unwrap(), b.unwrap(), c.unwrap()], [false; 3]);
}

#[distributed_lock(key = "order:{id}", wait = "10s", backend = "unordered")]
async fn pay_unordered(id: u64, inside: &Inside) -> Result<(), LockError> {
    inside.visit().await;
    Ok(())
}

#[tokio::test]
async fn futures_unordered_and_for_each_concurrent_contend() {
    register("unordered");
    let inside = Inside::default();
    let mut all: FuturesUnordered<_> = (0..4).map(|_| pay_unordered(7, &inside)).collect();
    while let Some(done) = all.next().await {
        done.unwrap();
    }
    assert_eq!(inside.most(), 1, "FuturesUnordered ran two bodies at once");

    let inside = Inside::default();
    stream::iter(0..4)
        .for_each_concurrent(None, |_| async {
            pay_unordered(7, &inside).await.unwrap();
        })
        .await;
    assert_eq!(
        inside.most(),
        1,
        "for_each_concurrent ran two bodies at once"
    );
}

#[distributed_lock(key = "order:{id}", backend = "select")]
async fn hold_long(id: u64) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

#[distributed_lock(key = "order:{id}", wait = "0s", backend = "select")]
async fn pay_now(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test]
async fn select_branches_contend() {
    register("select");
    let other = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        pay_now(5).await
    };
    tokio::select! {
        _ = hold_long(5) => panic!("the holder should still be sleeping"),
        attempt = other => assert!(
            matches!(attempt, Err(LockError::Busy { .. })),
            "a select! branch re-entered its sibling's lock: {attempt:?}"
        ),
    }
}

#[distributed_lock(key = "account:{id}", wait = "0s", backend = "nested")]
async fn outer(id: u32) -> Result<u32, LockError> {
    // Nested inside the holder's body: granted at once, not `Busy`.
    inner(id).await
}

#[distributed_lock(key = "account:{id}", wait = "0s", backend = "nested")]
async fn inner(id: u32, guard: &LockGuard) -> Result<u32, LockError> {
    assert!(guard.is_reentrant());
    Ok(id * 2)
}

#[tokio::test]
async fn nested_annotated_calls_reenter_in_the_root_future_too() {
    let backend = register("nested");
    // No spawned task: the root future of the test's `block_on`.
    assert_eq!(outer(21).await.unwrap(), 42);
    assert!(backend.holder("account:21").is_none());
}

#[distributed_lock(key = "ledger:{id}", wait = "0s", backend = "join-inside")]
async fn settle(id: u64) -> Result<(bool, bool), LockError> {
    // Both calls run inside this body, the holder's critical section: they
    // are part of it and re-enter, as a nested call does.
    let (a, b) = tokio::join!(entry(id), entry(id));
    Ok((a?, b?))
}

#[distributed_lock(key = "ledger:{id}", wait = "0s", backend = "join-inside")]
async fn entry(id: u64, guard: &LockGuard) -> Result<bool, LockError> {
    Ok(guard.is_reentrant())
}

#[tokio::test]
async fn join_inside_a_body_reenters() {
    let backend = register("join-inside");
    assert_eq!(settle(3).await.unwrap(), (true, true));
    assert!(backend.holder("ledger:3").is_none());
}

#[distributed_lock(key = "job:{id}", wait = "0s", backend = "spawned")]
async fn spawns(id: u64) -> Result<Result<(), LockError>, LockError> {
    // A spawned task is not inside the body, even when spawned from it.
    Ok(tokio::spawn(pay_spawned(id)).await.unwrap())
}

#[distributed_lock(key = "job:{id}", wait = "0s", backend = "spawned")]
async fn pay_spawned(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test]
async fn a_task_spawned_from_a_body_contends() {
    register("spawned");
    let attempt = spawns(9).await.unwrap();
    assert!(
        matches!(attempt, Err(LockError::Busy { .. })),
        "{attempt:?}"
    );
}

#[test]
fn two_block_on_bodies_on_one_thread_are_two_holders() {
    let backend = Arc::new(MemoryBackend::new());
    let lock = Lock::new("block-on").with_backend(backend);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = runtime.block_on(lock.acquire()).unwrap();
    // The guard moves to another thread and lives on there.
    let (keep, kept) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _guard = guard;
        kept.recv().ok();
    });
    let second = runtime.block_on(lock.clone().wait(Duration::ZERO).acquire());
    assert!(
        matches!(second, Err(LockError::Busy { .. })),
        "a second block_on on the same thread re-entered: {second:?}"
    );
    keep.send(()).unwrap();
    holder.join().unwrap();
}

#[tokio::test]
async fn the_plain_api_reenters_inside_scope_only() {
    let backend = Arc::new(MemoryBackend::new());
    let lock = Lock::new("plain").with_backend(backend);
    let guard = lock.acquire().await.unwrap();
    // Sequential double acquire outside a scope waits, as a mutex does.
    let err = lock
        .clone()
        .wait(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let (first, second) = guard
        .scope(async {
            let first = lock.try_acquire().await.unwrap().expect("re-enters");
            // Nested scopes keep the outer frame in force.
            let second = first
                .scope(lock.try_acquire())
                .await
                .unwrap()
                .expect("re-enters");
            (first.is_reentrant(), second.fencing_token())
        })
        .await;
    assert!(first);
    assert_eq!(second, guard.fencing_token());
    // After release, the scope no longer re-enters: a fresh acquire is a new
    // lease with a new fence.
    let fence = guard.fencing_token();
    let scope = guard.scope(async { lock.acquire().await });
    let released = {
        let lease = guard;
        lease.release().await.unwrap();
        scope.await.unwrap()
    };
    assert!(!released.is_reentrant());
    assert!(released.fencing_token() > fence);
}

/// Inside the scope of a lease that ran out (renewal off), an acquisition of
/// the same key is not handed the dead lease as a reentrant guard: it takes
/// a live lease of its own, with a greater fence, while another client that
/// took the key meanwhile keeps it out until it lets go.
#[tokio::test]
async fn a_lapsed_lease_is_not_reentered() {
    let backend = register("reenter-lapsed");
    let lock = Lock::new("order:lapsed")
        .backend("reenter-lapsed")
        .ttl(Duration::from_millis(60))
        .renew(false);
    let outer = lock.acquire().await.unwrap();
    let outer_fence = outer.fencing_token();
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(!outer.is_held());
    let other = Lock::new("order:lapsed")
        .with_backend(backend)
        .acquire()
        .await
        .expect("another caller takes the lapsed key");
    let inner = outer
        .scope(async {
            let waiting = lock.clone().wait(Duration::ZERO).acquire().await;
            assert!(
                matches!(waiting, Err(LockError::Busy { .. })),
                "inside a lapsed scope the key re-entered: {waiting:?}"
            );
            drop(other);
            lock.clone()
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap()
        })
        .await;
    assert!(!inner.is_reentrant(), "the dead lease was handed over");
    assert!(inner.is_held());
    assert!(inner.fencing_token() > outer_fence);
}
