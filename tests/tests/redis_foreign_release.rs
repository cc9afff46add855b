//! A Redis waiter behind a holder that is not dlock: its release publishes
//! nothing on dlock's channel (redis-py's `Lock.release`, `redis-cli DEL`,
//! `FLUSHALL`), so the waiter must learn of it by itself — from the server's
//! keyspace notifications when they are on, else by re-checking the key —
//! instead of sleeping until the old holder's ttl. And a waiter is not woken
//! by releases on another database (pub/sub channels are server-wide).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockError};
use dlock_tests::acquisitions::{self, acquire_and_release, got_within};
use dlock_tests::fixtures::redis::{lock_key, server_with_app_user};
use dlock_tests::foreign::waiting::{
    took, wait_for, BY_NOTIFICATION, BY_RECHECK, FOREIGN_TTL, HOLD, SHORT_FOREIGN_TTL,
};
use dlock_tests::foreign::PyLock;
use dlock_tests::servers::redis::{RedisCluster, RedisOptions, RedisServer};

async fn connect(url: &str) -> Arc<RedisBackend> {
    Arc::new(
        RedisBackend::connect(url)
            .await
            .expect("connect to the test server"),
    )
}

/// A server (with keyspace notifications if `notifying`) with the user
/// `app` (password `app-pw`, every key) whose ACL ends with `rules`, and the
/// URL that logs in as `app`.
fn with_app_user(notifying: bool, rules: &[&str]) -> (RedisServer, String) {
    let mut config = Vec::new();
    if notifying {
        config.extend(["--notify-keyspace-events", "Kgx"]);
    }
    config.extend(["--user", "app", "on", ">app-pw", "~*"]);
    config.extend_from_slice(rules);
    let server = RedisServer::start_with(RedisOptions::new().config(config));
    let url = format!("redis://app:app-pw@127.0.0.1:{}", server.port());
    (server, url)
}

fn notifying_server() -> RedisServer {
    RedisServer::start_with(RedisOptions::new().config(["--notify-keyspace-events", "Kgx"]))
}

/// Sets `key` as a foreign holder would: a token that is not dlock's, with a
/// ttl of [`FOREIGN_TTL`].
fn hold_foreign(server: &RedisServer, key: &str) {
    let ttl = FOREIGN_TTL.as_millis().to_string();
    assert_eq!(
        server.redis_cli(&["SET", key, "not-dlock", "PX", &ttl, "NX"]),
        "OK"
    );
}

/// Runs `redis-cli DEL key` and returns the instant before it started (so the
/// measured delay includes redis-cli's own start-up: an upper bound).
fn del(server: &RedisServer, key: &str) -> Instant {
    let before = Instant::now();
    let deleted = tokio::task::block_in_place(|| server.redis_cli(&["DEL", key]));
    assert_eq!(deleted, "1", "the foreign key was there to delete");
    before
}

/// A foreign holder on `key`, a dlock waiter behind it, and after [`HOLD`] a
/// `DEL` of the key: how long after the `DEL` the waiter held the lock.
async fn waiter_behind_a_del(
    server: &RedisServer,
    backend: Arc<dyn dlock::LockBackend>,
    key: &str,
    what: &str,
) -> Duration {
    hold_foreign(server, &lock_key(key));
    let waiter = wait_for(key, backend);
    tokio::time::sleep(HOLD).await;
    let released = del(server, &lock_key(key));
    took(waiter, released, what).await.1
}

/// A redis-py `Lock` on `key` held for [`HOLD`], a dlock waiter behind it:
/// how long after redis-py's release the waiter held the lock.
async fn waiter_behind_redis_py(
    server: &RedisServer,
    backend: Arc<dyn dlock::LockBackend>,
    key: &str,
    what: &str,
) -> Duration {
    let mut holder = PyLock::spawn(&lock_key(key), FOREIGN_TTL, HOLD, &[server.port()]);
    holder.held(Duration::from_secs(20)).await;
    let waiter = wait_for(key, backend);
    let released = holder.released(Duration::from_secs(20)).await;
    took(waiter, released, what).await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_py_release_wakes_the_waiter_within_the_recheck() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let late = waiter_behind_redis_py(&server, backend, "py", "redis-py Lock.release").await;
    assert!(
        late < BY_RECHECK,
        "the waiter slept through redis-py's release: it held the lock {late:?} after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cli_del_wakes_the_waiter_within_the_recheck() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let late = waiter_behind_a_del(&server, backend, "cli", "redis-cli DEL").await;
    assert!(
        late < BY_RECHECK,
        "the waiter slept through a DEL: it held the lock {late:?} after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keyspace_notifications_a_del_wakes_the_waiter_at_once() {
    let server = notifying_server();
    // Default URL: the re-check runs too, but only at its 1 s cap when the
    // server notifies; a wake within 200 ms of the DEL is the notification's.
    let backend = connect(&server.url()).await;
    assert!(backend.keyspace_notifications(), "read at connect");
    let late = waiter_behind_a_del(
        &server,
        backend,
        "notified",
        "DEL with notify-keyspace-events Kgx",
    )
    .await;
    assert!(
        late < BY_NOTIFICATION,
        "the keyspace notification of the DEL did not wake the waiter: it held the lock {late:?} after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keyspace_notifications_a_redis_py_release_wakes_the_waiter_at_once() {
    let server = notifying_server();
    let backend = connect(&server.url()).await;
    let late = waiter_behind_redis_py(
        &server,
        backend,
        "py-notified",
        "redis-py release, notifications on",
    )
    .await;
    assert!(
        late < BY_NOTIFICATION,
        "held the lock {late:?} after the release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushall_is_caught_by_the_recheck_even_with_notifications_on() {
    // FLUSHALL sends no keyspace event: the re-check at its cap is the net.
    let server = notifying_server();
    let backend = connect(&server.url()).await;
    hold_foreign(&server, &lock_key("flushed"));
    let waiter = wait_for("flushed", backend);
    tokio::time::sleep(HOLD).await;
    let released = Instant::now();
    tokio::task::block_in_place(|| assert_eq!(server.redis_cli(&["FLUSHALL"]), "OK"));
    let (_guard, late) = took(waiter, released, "FLUSHALL, notifications on").await;
    assert!(
        late < BY_RECHECK,
        "held the lock {late:?} after the FLUSHALL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recheck_ms_sets_the_cap_of_the_recheck() {
    let server = RedisServer::start();
    let backend = connect(&format!("{}?recheck_ms=100", server.url())).await;
    let late = waiter_behind_a_del(&server, backend, "short-cap", "DEL, recheck_ms=100").await;
    assert!(
        late < Duration::from_millis(600),
        "with a 100 ms cap the waiter held the lock {late:?} after the DEL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recheck_off_without_notifications_leaves_the_heartbeat() {
    // No re-check and no notifications: a DEL goes unheard by the re-checks,
    // but a lock's waiter is queued, and its heartbeat (a queued try every
    // 300 ms, which keeps its ticket alive) finds the key free and takes it.
    // Before the heartbeat it slept to the holder's PTTL (3 s here).
    let server = RedisServer::start();
    let backend = connect(&format!("{}?recheck_ms=0", server.url())).await;
    let key = lock_key("no-recheck");
    assert_eq!(
        server.redis_cli(&[
            "SET",
            &key,
            "not-dlock",
            "PX",
            &SHORT_FOREIGN_TTL.as_millis().to_string()
        ]),
        "OK"
    );
    let waiter = wait_for("no-recheck", backend.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deleted = Instant::now();
    del(&server, &key);
    let (_guard, late) = took(waiter, deleted, "recheck_ms=0, no notifications").await;
    assert!(
        late < Duration::from_millis(900),
        "the waiter's heartbeat should find the key free within 300 ms (and a slow machine's \
         margin), not {late:?} after the DEL"
    );
    assert_eq!(
        backend.metrics().rechecks,
        0,
        "recheck_ms=0 sends no re-check: the heartbeat is a queued try"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_get_refused_by_acl_counts_as_no_notifications() {
    // A user who may not run CONFIG (as on managed Redis): connect works,
    // and the waiter falls back to the re-check.
    let (server, url) = with_app_user(true, &["&*", "+@all", "-config"]);
    let backend = Arc::new(
        RedisBackend::connect(&url)
            .await
            .expect("a user without CONFIG can still connect"),
    );
    assert!(!backend.keyspace_notifications(), "unknown counts as off");
    let late = waiter_behind_a_del(&server, backend, "acl", "DEL, CONFIG refused").await;
    assert!(late < BY_RECHECK, "held the lock {late:?} after the DEL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspace_channels_refused_by_acl_leave_the_release_channel_working() {
    // The server notifies, but this user may only use dlock's channels: the
    // refused keyspace SUBSCRIBE must cost neither the release channel nor
    // the subscriber's connection, and the waiter falls back to the re-check.
    let (server, url) = with_app_user(true, &["resetchannels", "&dlock:*", "+@all"]);
    // A strict queue: the head takes the key at once (no gap left to
    // clients that do not queue after the holder's 1.5 s).
    let url = format!("{url}?foreign_share=0");
    let (holder_side, waiter_side) = (connect(&url).await, connect(&url).await);

    // A dlock release still wakes a waiter at once, through its channel.
    let guard = Lock::new("acl-channels")
        .with_backend(holder_side)
        .acquire()
        .await
        .expect("free");
    let waiter = wait_for("acl-channels", waiter_side.clone());
    tokio::time::sleep(HOLD).await;
    let released = Instant::now();
    guard.release().await.expect("release");
    let (guard, late) = took(waiter, released, "dlock release, keyspace refused").await;
    assert!(
        late < BY_NOTIFICATION,
        "held the lock {late:?} after a dlock release"
    );
    drop(guard);
    assert!(
        !waiter_side.keyspace_notifications(),
        "a refused keyspace channel turns notifications off for the backend"
    );

    // A foreign DEL is caught by the re-check.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let late = waiter_behind_a_del(
        &server,
        waiter_side,
        "acl-channels",
        "DEL, keyspace refused",
    )
    .await;
    assert!(late < BY_RECHECK, "held the lock {late:?} after the DEL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_on_a_cluster_wakes_the_waiter_within_the_recheck() {
    let cluster = RedisCluster::start(3);
    let backend = connect(&cluster.url()).await;
    assert!(
        !backend.keyspace_notifications(),
        "a cluster's waiters re-check instead"
    );
    let key = lock_key("clustered");
    let ttl = FOREIGN_TTL.as_millis().to_string();
    assert_eq!(
        cluster.redis_cli(&["SET", &key, "not-dlock", "PX", &ttl]),
        "OK"
    );
    let waiter = wait_for("clustered", backend);
    tokio::time::sleep(HOLD).await;
    let released = Instant::now();
    tokio::task::block_in_place(|| assert_eq!(cluster.redis_cli(&["DEL", &key]), "1"));
    let (_guard, late) = took(waiter, released, "DEL on a cluster").await;
    assert!(late < BY_RECHECK, "held the lock {late:?} after the DEL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_waiting_key_costs_one_heartbeat_per_300_ms() {
    // The cost at scale: a key whose holder never lets go, one waiter, no
    // notifications. After the first few fast re-checks, the waiter sends
    // its heartbeat, one queued try every 300 ms that keeps its ticket
    // alive (so a waiter that dies drops out of the line within a second),
    // and nothing else: its heartbeats are its checks.
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let key = lock_key("cost");
    assert_eq!(
        server.redis_cli(&["SET", &key, "not-dlock", "PX", "60000"]),
        "OK"
    );
    let lock = Lock::new("cost")
        .with_backend(backend.clone())
        .wait(Duration::from_secs(14));
    let waiter = tokio::spawn(async move { lock.acquire().await.map(drop) });
    // Past the back-off from a few ms up to the cap.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (sent, rechecks) = (backend.metrics().round_trips, backend.metrics().rechecks);
    tokio::task::block_in_place(|| server.redis_cli(&["CONFIG", "RESETSTAT"]));
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let evalsha = tokio::task::block_in_place(|| server.command_calls("evalsha"));
    let sent = backend.metrics().round_trips - sent;
    let rechecks = backend.metrics().rechecks - rechecks;
    println!(
        "one waiting key, no notifications: {sent} requests ({evalsha} EVALSHA, {rechecks} re-checks) in {window:?} \
         ({:.2} requests/s)",
        sent as f64 / window.as_secs_f64()
    );
    assert!(
        (20..=40).contains(&evalsha),
        "expected a heartbeat every 300 ms (about 33), got {evalsha} queued tries in {window:?}"
    );
    assert!(
        sent <= evalsha + 12,
        "{sent} requests in {window:?}: more than the heartbeats and a re-check a second"
    );
    assert!(matches!(
        waiter.await.expect("the waiter task"),
        Err(LockError::Timeout { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_channels_refused_by_acl_leave_waiters_to_the_recheck_without_a_reconnect_loop() {
    // A user allowed no channel at all: the subscriber is refused even
    // dlock's release channels. It must keep its connection (not reconnect
    // and be refused again, in a loop), and waiters still get the lock, by
    // the re-check, soon after a release.
    let (server, url) = with_app_user(false, &["resetchannels", "+@all"]);
    let (holder_side, waiter_side) = (connect(&url).await, connect(&url).await);
    let connections = || -> u64 {
        let stats = server.redis_cli(&["INFO", "stats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_connections_received in INFO stats")
    };

    let guard = Lock::new("acl-none")
        .with_backend(holder_side)
        .acquire()
        .await
        .expect("free");
    let before = connections();
    let waiter = wait_for("acl-none", waiter_side.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let opened = connections() - before;
    assert!(
        opened <= 3,
        "the subscriber opened {opened} connections in 2 s: it reconnects in a loop"
    );
    assert!(
        waiter_side.release_channels_refused(),
        "the refusal is known to the backend"
    );
    let released = Instant::now();
    guard.release().await.expect("release");
    let (guard, late) = took(waiter, released, "dlock release, channels refused").await;
    assert!(late < BY_RECHECK, "held the lock {late:?} after a release");
    drop(guard);
}

/// The release channels a waiter of `key` subscribed to, as the server
/// lists them (`PUBSUB CHANNELS`).
fn channels_of(server: &RedisServer, key: &str) -> Vec<String> {
    let out = tokio::task::block_in_place(|| {
        server.redis_cli(&["PUBSUB", "CHANNELS", &format!("dlock:{{{key}}}:*")])
    });
    let mut channels: Vec<String> = out.lines().map(str::to_owned).collect();
    channels.sort();
    channels
}

/// Pub/sub channels are global to a server, keys are per database: a waiter
/// on database 2 is not woken by the releases of the same name on database
/// 1 (its channel is `dlock:{k}:released:db2`; database 0 keeps
/// `dlock:{k}:released`), and is still woken by its own database's release.
/// Re-checks off, so every request of the waiter is a wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_not_woken_by_another_databases_releases() {
    const CHURN: u64 = 100;
    let server = RedisServer::start();
    let db = |n: u32| format!("{}/{n}?recheck_ms=0", server.url());
    let (holder, waiter) = (connect(&db(2)).await, connect(&db(2)).await);
    let (churn, zero) = (connect(&db(1)).await, connect(&db(0)).await);
    let key = "shared";
    let lock = |backend: &Arc<RedisBackend>| {
        Lock::new(key)
            .with_backend(backend.clone())
            .ttl(Duration::from_secs(30))
    };
    let held = lock(&holder).acquire().await.unwrap();
    let held_zero = lock(&zero).acquire().await.unwrap();
    let waiting = acquisitions::wait_for(lock(&waiter).wait(Duration::from_secs(20)));
    let deadline = Instant::now() + Duration::from_secs(5);
    while channels_of(&server, key).is_empty() {
        assert!(Instant::now() < deadline, "the waiter never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = waiter.metrics().round_trips;
    for _ in 0..CHURN {
        acquire_and_release(&lock(&churn)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let woken = waiter.metrics().round_trips - before;
    println!("wake-ups of the database-2 waiter by {CHURN} database-1 releases: {woken}");
    assert!(
        woken <= 1,
        "{woken} wake-ups by {CHURN} releases on another database"
    );

    let zero_waiting = {
        let waiter = lock(&connect(&db(0)).await).wait(Duration::from_secs(20));
        tokio::spawn(async move { waiter.acquire().await })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while channels_of(&server, key).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the database-0 waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        channels_of(&server, key),
        ["dlock:{shared}:released", "dlock:{shared}:released:db2"],
        "the channel layout"
    );

    // Its own database's release wakes it at once; database 0's waiter too.
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = got_within(
        waiting,
        released,
        Duration::from_secs(1),
        "the database-2 waiter did not get the lock",
    )
    .await;
    guard.release().await.unwrap();
    held_zero.release().await.unwrap();
    zero_waiting
        .await
        .unwrap()
        .expect("the database-0 waiter did not get the lock")
        .release()
        .await
        .unwrap();
}

/// An ACL user limited to the keys of one lock (`~dlock:{jobs}*`) but with
/// every command dlock needs: that lock works; another lock, a semaphore
/// and a read-write lock are refused with an error that names them, their
/// keys and channel, and the ACL rule, with Redis's `NOPERM` kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_the_key_and_the_missing_grant() {
    let (_server, url) =
        server_with_app_user("~dlock:{jobs}*", dlock::backends::redis::ACL_COMMANDS);
    let backend: Arc<dyn dlock::LockBackend> = connect(&url).await;
    let lock = |key: &str| Lock::new(key).with_backend(backend.clone());
    acquire_and_release(&lock("jobs")).await;

    let expect = |err: LockError, parts: &[&str]| {
        assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
        let shown = err.to_string();
        for part in parts
            .iter()
            .chain(&["~dlock:* &dlock:*", "+evalsha", "no permissions"])
        {
            assert!(shown.contains(part), "{part:?} not in: {shown}");
        }
        assert!(!shown.contains("app-pw"), "{shown}");
    };
    let err = lock("orders").try_acquire().await.unwrap_err();
    expect(
        err,
        &[
            "lock `orders`",
            "`dlock:{orders}`",
            "`dlock:{orders}:released`",
        ],
    );
    let err = dlock::Semaphore::new("exports", 2)
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .unwrap_err();
    expect(err, &["semaphore `exports`", "`dlock:{exports}:permits`"]);
    let err = dlock::RwLock::new("prices")
        .with_backend(backend.clone())
        .try_read()
        .await
        .unwrap_err();
    expect(
        err,
        &["read-write lock `prices`", "`dlock:{prices}:rw:readers`"],
    );
}
