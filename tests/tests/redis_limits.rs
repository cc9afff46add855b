//! Durations at the edges on Redis and Redlock: a ttl of `Duration::MAX`
//! is refused with `InvalidOption` naming the maximum, the maximum itself
//! works (locks and permits), and waits with the farthest deadlines or
//! per-node timeouts do not overflow.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::AcquireRequest;
use dlock::backends::redis::RedisBackend;
use dlock::backends::redlock::RedlockBackend;
use dlock::MAX_TTL;
use dlock::{Lock, LockBackend, LockError, Semaphore};
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::redis::{RedisServer, RedisSet};

/// About as far as an `Instant` reaches: what a wait of "forever" becomes.
fn far_deadline() -> Instant {
    Instant::now() + Duration::from_secs(u64::MAX >> 2)
}

/// Asserts `result` is `InvalidOption` naming `what` and the maximum.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, LockError>, what: &str) {
    match result {
        Err(e @ LockError::InvalidOption { .. }) => {
            let text = e.to_string();
            assert!(text.contains(what), "{text}");
            assert!(text.contains(&format!("{MAX_TTL:?}")), "{text}");
        }
        other => panic!("expected InvalidOption about {what}, got {other:?}"),
    }
}

/// `Duration::MAX` as `lock`'s ttl is refused, by `try_acquire` and by an
/// `acquire` that would wait alike.
async fn ttl_max_is_refused(lock: &Lock) {
    refused(lock.clone().ttl(Duration::MAX).try_acquire().await, "ttl");
    refused(
        lock.clone()
            .ttl(Duration::MAX)
            .wait(Duration::from_secs(1))
            .acquire()
            .await,
        "ttl",
    );
}

fn request(key: &str, token: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        key: key.to_owned(),
        token: token.to_owned(),
        ttl,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_a_ttl_beyond_the_maximum_and_takes_the_maximum() {
    let server = RedisServer::start();
    let backend: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let lock = Lock::new("forever").with_backend(backend.clone());
    ttl_max_is_refused(&lock).await;
    let semaphore = Semaphore::new("forever-permits", 2).with_backend(backend.clone());
    refused(
        semaphore.clone().ttl(Duration::MAX).try_acquire().await,
        "ttl",
    );
    refused(
        semaphore
            .clone()
            .ttl(MAX_TTL + Duration::from_millis(1))
            .wait(Duration::from_secs(1))
            .acquire()
            .await,
        "ttl",
    );

    // The maximum itself is a valid lease, on the server too.
    let guard = lock
        .clone()
        .ttl(MAX_TTL)
        .try_acquire()
        .await
        .expect("the maximum ttl is accepted")
        .expect("a free key");
    let pttl: u64 = server
        .redis_cli(&["PTTL", "dlock:{forever}"])
        .parse()
        .unwrap();
    let max_ms = u64::try_from(MAX_TTL.as_millis()).unwrap();
    assert!(pttl > max_ms - 60_000 && pttl <= max_ms, "PTTL {pttl}");
    guard.release().await.unwrap();
    let permit = semaphore
        .ttl(MAX_TTL)
        .try_acquire()
        .await
        .expect("the maximum ttl is accepted for a permit")
        .expect("a free permit");
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_waits_with_the_farthest_deadline() {
    let server = RedisServer::start();
    // The request timeout at its largest, too.
    let url = format!("{}?timeout_ms={}", server.url(), u64::MAX);
    let backend = RedisBackend::connect(&url).await.unwrap();
    let short = Duration::from_millis(300);
    let first = backend
        .try_acquire(&request("far", "first", short))
        .await
        .unwrap()
        .expect("a free key");
    let started = Instant::now();
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        backend.acquire(&request("far", "second", short), Some(far_deadline())),
    )
    .await
    .expect("the wait ended when the first lease expired")
    .unwrap()
    .expect("acquired after the first lease expired");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_ne!(second.fencing_token, first.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_a_ttl_or_quarantine_beyond_the_maximum() {
    let set = RedisSet::start(3);
    let backend: Arc<dyn LockBackend> =
        Arc::new(RedlockBackend::connect(&set.url()).await.unwrap());
    let lock = Lock::new("redlock-forever").with_backend(backend.clone());
    ttl_max_is_refused(&lock).await;
    let guard = lock
        .ttl(MAX_TTL)
        .try_acquire()
        .await
        .expect("the maximum ttl is accepted")
        .expect("a free key");
    guard.release().await.unwrap();

    let quarantined = RedlockBackend::connect(&set.url())
        .await
        .unwrap()
        .restart_quarantine(Duration::MAX);
    refused(
        quarantined
            .try_acquire(&request("q", "t", Duration::from_secs(5)))
            .await,
        "restart_quarantine",
    );
    let url = format!("{}?restart_quarantine_ms={}", set.url(), u64::MAX);
    refused(RedlockBackend::connect(&url).await, "restart_quarantine_ms");
}

/// Split votes (two masters held by another owner, one down) make a round
/// retry after a delay drawn from the per-node timeout; with the largest
/// timeout and the farthest deadline nothing overflows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waits_with_the_largest_timeouts() {
    let mut set = RedisSet::start(5);
    let huge = RedlockBackend::connect(&set.url())
        .await
        .unwrap()
        .node_timeout(Duration::MAX);
    let lock_key = dlock_tests::fixtures::redis::lock_key("split");
    for i in 0..2 {
        set.server(i)
            .redis_cli(&["SET", &lock_key, "other-owner", "PX", "1500"]);
    }
    set.server_mut(4).kill9();
    let req = request("split", "mine", Duration::from_secs(5));
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        huge.acquire(&req, Some(Instant::now() + Duration::from_millis(300))),
    )
    .await
    .expect("a wait of 300 ms ended");
    assert!(matches!(answer, Ok(None)), "{answer:?}");
    // And with the farthest deadline: acquired once the other owner's keys expire.
    let lease = tokio::time::timeout(
        Duration::from_secs(20),
        huge.acquire(&req, Some(far_deadline())),
    )
    .await
    .expect("the wait ended when the other owner's keys expired")
    .unwrap()
    .expect("acquired");
    assert!(huge.release(&lease).await.unwrap());
}
