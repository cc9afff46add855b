//! Thousands of Redis guards dropped at once without `release()` (a `Vec` of
//! guards going out of scope, a panic unwinding through their owner) are
//! each released in the background: the process stays alive (the drop
//! once overflowed a tokio worker's stack and aborted it), every key is
//! gone from the server within a bounded time, and a new lock on one of
//! them is granted.
//!
//! Each test takes the guards on one backend object, 500 at a time (as
//! `held_50k.rs`), in a multi-thread runtime with tokio's default worker
//! stack size, then drops them all in one go. The overflow came when the
//! runtime itself ended with the 50,000 releases still queued (a test or a
//! `main` that panics holding the guards unwinds out of `block_on` and drops
//! its runtime): the two `fifty_thousand_*` tests do that with 50,000; the
//! `ten_thousand_*` ones drop 10,000 inside a running runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockGuard};
use dlock_tests::fixtures::redis::lock_key;
use dlock_tests::servers::redis::{RedisOptions, RedisServer};
use tokio::task::JoinSet;

/// The guards dropped with their runtime: the overflow needed about 6,250
/// nested hand-overs of a batch of 8 releases, so fewer would not catch it.
const HELD: usize = 50_000;
/// The guards dropped inside a running runtime: these never overflowed
/// (each hand-over is a task of its own there); what they check is that
/// every background release reaches the server, which 10,000 show as well
/// as 50,000 at a fifth of the time (CI's length).
const HELD_IN_A_RUNNING_RUNTIME: usize = 10_000;
const IN_FLIGHT: usize = 500;
/// Long enough that no lease expires on its own while the 50,000 are
/// taken and dropped: the keys must be gone because they were released.
const TTL: Duration = Duration::from_secs(120);
/// How long one acquisition may take (as `held_50k.rs`).
const WAIT: Duration = Duration::from_secs(30);
/// The bound on the background releases of all 50,000 keys after the drop.
/// Generous: a debug build on a shared 2-core machine; the figure is printed.
const RELEASED_WITHIN: Duration = Duration::from_secs(60);

/// One at a time: two 50,000-lock takes on 2 cores starve each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn key(test: &str, i: usize) -> String {
    format!("mass-drop:{test}:{i:05}")
}

/// Takes the `held` locks `key(test, i)` on `backend`, at most
/// [`IN_FLIGHT`] at a time.
async fn take_all(backend: Arc<dyn LockBackend>, test: &str, held: usize) -> Vec<LockGuard> {
    let started = Instant::now();
    let mut guards = Vec::with_capacity(held);
    let mut taking = JoinSet::new();
    let mut next = 0;
    while guards.len() < held {
        while next < held && taking.len() < IN_FLIGHT {
            let lock = Lock::new(key(test, next))
                .with_backend(backend.clone())
                .ttl(TTL)
                .wait(WAIT);
            taking.spawn(async move { lock.acquire().await });
            next += 1;
        }
        let guard = taking.join_next().await.unwrap().unwrap();
        guards.push(guard.unwrap_or_else(|e| panic!("acquire: {e}")));
    }
    eprintln!("{test}: {held} locks taken in {:?}", started.elapsed());
    guards
}

/// How many of the test's lock keys are still on the server (SCAN of the
/// prefix: only the lease keys, `dlock:{mass-drop:<test>:NNNNN}`).
fn lock_keys_left(server: &RedisServer, test: &str) -> usize {
    let pattern = format!("dlock:{{mass-drop:{test}:*}}");
    let out = server.redis_cli(&["--scan", "--pattern", &pattern]);
    out.lines().filter(|l| !l.is_empty()).count()
}

/// Waits (bounded) until none of the test's lock keys is left on the
/// server, printing how long the background releases took.
async fn wait_all_released(server: &RedisServer, test: &str, held: usize, dropped_at: Instant) {
    let deadline = dropped_at + RELEASED_WITHIN;
    loop {
        let left = tokio::task::block_in_place(|| lock_keys_left(server, test));
        if left == 0 {
            eprintln!(
                "{test}: all {held} keys released {:?} after the drop",
                dropped_at.elapsed()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{test}: {left} of {held} lock keys still on the server {RELEASED_WITHIN:?} after the drop"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A new holder (another backend object) is granted one of the dropped keys
/// at once.
async fn one_key_is_free_again(server: &RedisServer, test: &str, held: usize) {
    let other = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let guard = Lock::new(key(test, held / 2))
        .with_backend(other)
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{test}: a dropped key is granted again: {e}"));
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert_eq!(
        server.redis_cli(&["EXISTS", &lock_key(&key(test, held / 2))]),
        "0"
    );
}

/// Takes the guards, drops them with `drop_them`, then checks the keys are
/// released and one is granted again.
async fn mass_drop(server: &RedisServer, test: &str, drop_them: impl FnOnce(Vec<LockGuard>)) {
    let backend = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let held = HELD_IN_A_RUNNING_RUNTIME;
    let guards = take_all(backend.clone(), test, held).await;
    assert_eq!(
        tokio::task::block_in_place(|| lock_keys_left(server, test)),
        held
    );
    let dropped_at = Instant::now();
    drop_them(guards);
    eprintln!("{test}: drop returned after {:?}", dropped_at.elapsed());
    wait_all_released(server, test, held, dropped_at).await;
    one_key_is_free_again(server, test, held).await;
    drop(backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_guards_dropped_at_once_are_released() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    mass_drop(&server, "plain", drop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_guards_dropped_at_once_with_keyspace_events() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let server =
        RedisServer::start_with(RedisOptions::new().config(["--notify-keyspace-events", "KEA"]));
    mass_drop(&server, "events", drop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_guards_dropped_by_a_panic_unwinding() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    mass_drop(&server, "unwind", |guards| {
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _owned = guards;
            panic!("the owner of 10,000 guards panics");
        }));
        assert!(unwound.is_err(), "the panic unwound through the guards");
    })
    .await;
}

/// A multi-thread runtime with tokio's default worker stack size.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Takes the guards on a runtime of their own, lets `end` drop them and
/// that runtime (each in its way), then checks on another runtime that the
/// process is alive, every key is released (the releases cut short by the
/// runtime's end finish on dlock's background runtime) and one is granted
/// again.
fn mass_drop_with_the_runtime(
    test: &str,
    end: impl FnOnce(tokio::runtime::Runtime, Arc<RedisBackend>) -> Instant,
) {
    let _alone = ONE_AT_A_TIME.blocking_lock();
    let server = RedisServer::start();
    let taking = runtime();
    let backend =
        taking.block_on(async { Arc::new(RedisBackend::connect(&server.url()).await.unwrap()) });
    let dropped_at = end(taking, backend);
    eprintln!(
        "{test}: guards and runtime dropped in {:?}",
        dropped_at.elapsed()
    );
    runtime().block_on(async {
        wait_all_released(&server, test, HELD, dropped_at).await;
        one_key_is_free_again(&server, test, HELD).await;
    });
}

#[test]
fn fifty_thousand_guards_dropped_then_their_runtime() {
    let test = "runtime";
    mass_drop_with_the_runtime(test, |taking, backend| {
        let guards = taking.block_on(take_all(backend, test, HELD));
        let dropped_at = Instant::now();
        drop(guards);
        drop(taking);
        dropped_at
    });
}

#[test]
fn fifty_thousand_guards_and_their_runtime_dropped_by_a_panic() {
    let test = "panic";
    mass_drop_with_the_runtime(test, |taking, backend| {
        // As a `#[tokio::test]` or a `#[tokio::main]` that panics holding
        // the guards: the unwind drops them inside `block_on`, then the
        // runtime.
        let mut dropped_at = None;
        let at = &mut dropped_at;
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            taking.block_on(async {
                let _owned = take_all(backend, test, HELD).await;
                *at = Some(Instant::now());
                panic!("the owner of 50,000 guards panics");
            })
        }));
        assert!(unwound.is_err(), "the panic unwound through the guards");
        dropped_at.expect("the guards were taken")
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_guards_dropped_by_a_panicking_task() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let backend = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let test = "task";
    let held = HELD_IN_A_RUNNING_RUNTIME;
    let guards = take_all(backend.clone(), test, held).await;
    let dropped_at = Instant::now();
    let holder = tokio::spawn(async move {
        let _owned = guards;
        tokio::task::yield_now().await;
        panic!("the task holding 10,000 guards panics");
    });
    let joined = holder.await;
    assert!(
        joined.as_ref().is_err_and(|e| e.is_panic()),
        "the task panicked"
    );
    wait_all_released(&server, test, held, dropped_at).await;
    one_key_is_free_again(&server, test, held).await;
}
