//! `dlock::shutdown` finishes the work drops handed off before it stops
//! dlock's runtime: a guard dropped without `release()` and a waiting
//! acquisition dropped from the Redis queue, both right before the call,
//! leave nothing on the server once it returns. A test binary of its own
//! (`shutdown` ends dlock for the whole process).
//!
//! On loopback the handed-off work is usually done before `shutdown` even
//! reaches its wait, so this guards the outcome rather than proving the
//! wait; `dlock-cli/tests/liveness.rs` shows what the wait is for: a process
//! that exits right after giving up.

use std::time::{Duration, Instant};

use dlock::Lock;
use dlock_tests::servers::redis::RedisServer;

#[tokio::test(flavor = "current_thread")]
async fn shutdown_waits_for_the_departures_and_releases_drops_handed_off() {
    let server = RedisServer::start();
    let ours = dlock::connect(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(30);
    let dropped = Lock::new("inflight:dropped")
        .ttl(ttl)
        .with_backend(ours.clone())
        .acquire()
        .await
        .unwrap();
    // Held by somebody else (so shutdown has no lease of its own to
    // release, which would give the handed-off work a round trip's time).
    server.redis_cli(&["SET", "dlock:{inflight:queue}", "foreign", "PX", "30000"]);
    let waiting = Lock::new("inflight:queue")
        .wait(Duration::from_secs(30))
        .with_backend(ours.clone());
    let waiter = tokio::spawn(async move { waiting.acquire().await });
    let start = Instant::now();
    while server
        .redis_cli(&["ZCARD", "dlock:{inflight:queue}:queue"])
        .trim()
        != "1"
    {
        assert!(start.elapsed() < Duration::from_secs(10), "never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Both drops hand their work to the background; shutdown comes at once.
    waiter.abort();
    let _ = waiter.await;
    drop(dropped);
    let start = Instant::now();
    assert_eq!(dlock::shutdown().await, 0);
    let took = start.elapsed();
    println!("shutdown took {took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Asked of the server directly: dlock's connections are gone.
    assert_eq!(
        server.redis_cli(&["EXISTS", "dlock:{inflight:dropped}"]),
        "0",
        "the dropped guard's release did not run before shutdown returned"
    );
    assert_eq!(
        server.redis_cli(&["ZCARD", "dlock:{inflight:queue}:queue"]),
        "0",
        "the dropped waiter's ticket is still queued"
    );
}
