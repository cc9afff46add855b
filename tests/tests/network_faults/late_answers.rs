//! Several callers in flight on one connection whose answers come late.

use std::time::Duration;

use dlock::Lock;
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::redis::RedisServer;

use super::{connect, WAIT};

/// Twenty callers in flight on one connection whose answers arrive a second
/// late, in order: each is granted the key it asked for, with its own
/// token (its release, a compare-and-delete of that token, succeeds), and
/// the fences of one key never repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_callers_in_flight_on_a_late_connection_each_get_their_own_answer() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let backend = connect(&format!("redis://{}?timeout=10s", proxy.addr())).await;
    let guard = Lock::new("warm")
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    proxy.delay_replies(Duration::from_secs(1));
    let mut asks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let b = backend.clone();
        asks.spawn(async move {
            let key = format!("late:{i}");
            let guard = Lock::new(key.clone())
                .with_backend(b)
                .ttl(Duration::from_secs(30))
                .wait(WAIT)
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            (key, guard)
        });
    }
    let mut guards = Vec::new();
    while let Some(done) = asks.join_next().await {
        let (key, guard) = done.unwrap();
        assert_eq!(guard.key(), key, "a caller got another caller's lease");
        guards.push(guard);
    }
    proxy.pass();
    for guard in guards {
        let key = guard.key().to_owned();
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("{key}: the lease was not this caller's: {e}"));
    }
}
