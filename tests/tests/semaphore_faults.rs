//! Semaphore fault tests against a real Redis: a SIGKILLed holder's permit.

use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::Semaphore;
use dlock_tests::holder::Holder;
use dlock_tests::servers::redis::RedisServer;

const HOLDER: &str = env!("CARGO_BIN_EXE_permit-holder");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permit_comes_back_after_its_ttl() {
    let server = RedisServer::start();
    let ttl = Duration::from_millis(1500);
    let mut holder = Holder::spawn_permit(
        HOLDER,
        &server.url(),
        "crash-permits",
        1,
        ttl,
        Duration::from_secs(60),
    );
    holder.acquired(Duration::from_secs(20)).await;
    let backend = std::sync::Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let semaphore = Semaphore::new("crash-permits", 1).with_backend(backend);
    assert!(
        semaphore.try_acquire().await.unwrap().is_none(),
        "the holder has the only permit"
    );
    holder.kill9().await;
    let killed = Instant::now();
    let permit = semaphore
        .wait(ttl * 4)
        .acquire()
        .await
        .expect("the crashed holder's permit never expired");
    let took = killed.elapsed();
    assert!(
        took <= ttl + Duration::from_secs(1),
        "the permit came back after {took:?}, ttl {ttl:?}"
    );
    let members = server.redis_cli(&["ZCARD", "dlock:{crash-permits}:permits"]);
    assert_eq!(
        members, "2",
        "only the new permit (and the count) is in the set"
    );
    let count = server.redis_cli(&["ZSCORE", "dlock:{crash-permits}:permits", "permits"]);
    assert_eq!(count, "-1", "the count, stored as minus its value");
    permit.release().await.unwrap();
    let members = server.redis_cli(&["EXISTS", "dlock:{crash-permits}:permits"]);
    assert_eq!(members, "0", "the last release leaves no set behind");
}
