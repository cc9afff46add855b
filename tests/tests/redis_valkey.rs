//! Lua-free renewal: on a server that takes `SET … IFEQ` (Valkey 8.1 here)
//! lock renewals are that one command; on Redis 7.0, which does not, they
//! stay the compare-and-`PEXPIRE` script. Both renew, both refuse a key that
//! is someone else's.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::fixtures::redis::lock_key;
use dlock_tests::servers::redis::{RedisOptions, RedisServer};

const TTL: Duration = Duration::from_millis(900);

/// Holds a lock for 3 ttls (renewed about every third of a ttl) and
/// returns how many `SET` and `EVALSHA` calls the server ran meanwhile.
async fn renewals_while_held(server: &RedisServer) -> (u64, u64) {
    let backend = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let lock = Lock::new("renewed").ttl(TTL).with_backend(backend);
    let guard = lock.acquire().await.unwrap();
    let (set, evalsha) = (server.command_calls("set"), server.command_calls("evalsha"));
    tokio::time::sleep(3 * TTL).await;
    assert!(guard.is_held(), "the lease was lost while renewed");
    assert_eq!(
        server.redis_cli(&["GET", &lock_key("renewed")]),
        guard.token(),
        "the key is not the holder's after 3 ttls"
    );
    let counts = (
        server.command_calls("set") - set,
        server.command_calls("evalsha") - evalsha,
    );
    guard.release().await.unwrap();
    counts
}

#[tokio::test]
async fn valkey_renews_with_set_ifeq_and_no_script() {
    let server = RedisServer::start_with(RedisOptions::new().valkey());
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    assert!(
        backend.renews_without_scripts(),
        "Valkey 8.1 takes SET … IFEQ, but the probe at connect said no"
    );
    // The probe wrote nothing.
    assert_eq!(server.redis_cli(&["DBSIZE"]), "0");
    let (set, evalsha) = renewals_while_held(&server).await;
    assert!(
        set >= 3,
        "only {set} SET calls in 3 ttls: renewals did not use SET … IFEQ"
    );
    assert_eq!(evalsha, 0, "renewals ran {evalsha} scripts");
}

#[tokio::test]
async fn redis_7_renews_with_the_script() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    assert!(
        !backend.renews_without_scripts(),
        "Redis 7.0 has no SET … IFEQ"
    );
    let (set, evalsha) = renewals_while_held(&server).await;
    assert_eq!(set, 0, "Redis 7.0 was sent {set} SET calls");
    assert!(evalsha >= 3, "only {evalsha} renewal scripts in 3 ttls");
}

/// `SET … IFEQ` compares: a key that someone else holds now is not
/// extended, and the guard reports the loss.
#[tokio::test]
async fn valkey_refuses_to_renew_a_key_that_is_someone_elses() {
    let server = RedisServer::start_with(RedisOptions::new().valkey());
    let backend: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let guard = Lock::new("taken")
        .ttl(TTL)
        .with_backend(backend)
        .acquire()
        .await
        .unwrap();
    let key = lock_key("taken");
    server.redis_cli(&["SET", &key, "someone-else", "PX", "60000"]);
    tokio::time::timeout(2 * TTL, guard.lost())
        .await
        .expect("the lease was not reported lost after its key was taken");
    assert_eq!(server.redis_cli(&["GET", &key]), "someone-else");
    let pttl: i64 = server.redis_cli(&["PTTL", &key]).parse().unwrap();
    assert!(
        pttl > 30_000,
        "the other owner's expiry was changed: {pttl} ms"
    );
}

/// Issue 23, case 3: the probe at connect is not the last word. Valkey 8.1
/// (which takes `SET … IFEQ`) is replaced on the same address by Redis 7.0
/// (which answers it with a syntax error) holding the lease, as after a
/// failover to an older replica or in a rolling downgrade. Renewals must
/// switch to the script at once and keep the lease for several ttls;
/// before, every renewal failed and the lease was lost within one ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_fall_back_to_the_script_when_the_server_stops_taking_set_ifeq() {
    let ttl = Duration::from_secs(2);
    let valkey = RedisServer::start_with(RedisOptions::new().valkey());
    let port = valkey.port();
    let backend = Arc::new(RedisBackend::connect(&valkey.url()).await.unwrap());
    assert!(backend.renews_without_scripts(), "Valkey 8.1 takes IFEQ");
    let guard = Lock::new("downgraded")
        .ttl(ttl)
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    let key = lock_key("downgraded");
    let pttl = valkey.redis_cli(&["PTTL", &key]);
    drop(valkey);
    let redis = RedisServer::start_on(port, RedisOptions::new());
    redis.redis_cli(&["SET", &key, guard.token(), "PX", &pttl]);

    tokio::time::sleep(3 * ttl).await;
    assert!(
        guard.is_held(),
        "the lease was lost once the server stopped taking SET … IFEQ"
    );
    assert_eq!(redis.redis_cli(&["GET", &key]), guard.token());
    let pttl: u64 = redis.redis_cli(&["PTTL", &key]).parse().unwrap();
    assert!(
        pttl > 1_000,
        "the key was not renewed: {pttl} ms left of a 2 s ttl"
    );
    assert!(
        !backend.renews_without_scripts(),
        "still claims Lua-free renewals after the server refused them"
    );
    assert!(
        redis.command_calls("evalsha") >= 3,
        "renewals did not run the script"
    );
    guard.release().await.unwrap();
    assert_eq!(redis.redis_cli(&["EXISTS", &key]), "0");
}
