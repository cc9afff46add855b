//! A Redlock waiter behind a holder that is not dlock, on three masters: its
//! release (redis-py's `Lock.release` on every master, or `redis-cli DEL` on a
//! quorum of them) publishes nothing on dlock's channel, so the waiter must
//! learn of it by itself — from the masters' keyspace notifications when they
//! are on, else by re-checking the key on every master — instead of sleeping
//! until the old holder's ttl.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redlock::RedlockBackend;
use dlock::{Lock, LockError};
use dlock_tests::fixtures::redis::lock_key;
use dlock_tests::foreign::waiting::{
    took, wait_for, woke_at_the_holders_expiry, BY_NOTIFICATION, BY_RECHECK, FOREIGN_TTL, HOLD,
    SHORT_FOREIGN_TTL,
};
use dlock_tests::foreign::PyLock;
use dlock_tests::servers::redis::{RedisOptions, RedisServer, RedisSet};

const MASTERS: usize = 3;
async fn connect(url: &str) -> Arc<RedlockBackend> {
    Arc::new(
        RedlockBackend::connect(url)
            .await
            .expect("connect to the test masters"),
    )
}

fn notifying_set() -> RedisSet {
    RedisSet::try_start_with(
        MASTERS,
        RedisOptions::new().config(["--notify-keyspace-events", "Kgx"]),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn ports(set: &RedisSet) -> Vec<u16> {
    set.servers().iter().map(RedisServer::port).collect()
}

/// Sets `key` on every master as a foreign holder would, for `ttl`.
fn hold_foreign(set: &RedisSet, key: &str, ttl: Duration) {
    let ttl = ttl.as_millis().to_string();
    for server in set.servers() {
        assert_eq!(
            server.redis_cli(&["SET", key, "not-dlock", "PX", &ttl, "NX"]),
            "OK"
        );
    }
}

/// `redis-cli DEL key` on a bare quorum of the masters (the first two; the
/// third keeps the foreign key). Returns the instant before the first one.
fn del_on_quorum(set: &RedisSet, key: &str) -> Instant {
    let before = Instant::now();
    tokio::task::block_in_place(|| {
        for server in &set.servers()[..MASTERS / 2 + 1] {
            assert_eq!(server.redis_cli(&["DEL", key]), "1");
        }
    });
    before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_py_release_on_every_master_wakes_the_waiter_within_the_recheck() {
    let set = RedisSet::start(MASTERS);
    let backend = connect(&set.url()).await;
    let mut holder = PyLock::spawn(&lock_key("py"), FOREIGN_TTL, HOLD, &ports(&set));
    holder.held(Duration::from_secs(20)).await;
    let waiter = wait_for("py", backend);
    let released = holder.released(Duration::from_secs(20)).await;
    let (_guard, late) = took(waiter, released, "redlock, redis-py Lock.release").await;
    assert!(
        late < BY_RECHECK,
        "the waiter slept through redis-py's release: it held the lock {late:?} after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_on_a_quorum_wakes_the_waiter_within_the_recheck() {
    let set = RedisSet::start(MASTERS);
    let backend = connect(&set.url()).await;
    hold_foreign(&set, &lock_key("cli"), FOREIGN_TTL);
    let waiter = wait_for("cli", backend);
    tokio::time::sleep(HOLD).await;
    let released = del_on_quorum(&set, &lock_key("cli"));
    let (_guard, late) = took(waiter, released, "redlock, DEL on a quorum").await;
    assert!(
        late < BY_RECHECK,
        "the waiter slept through the DELs: it held the lock {late:?} after them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keyspace_notifications_a_del_on_a_quorum_wakes_the_waiter_at_once() {
    let set = notifying_set();
    let backend = connect(&set.url()).await;
    hold_foreign(&set, &lock_key("notified"), FOREIGN_TTL);
    let waiter = wait_for("notified", backend);
    tokio::time::sleep(HOLD).await;
    let released = del_on_quorum(&set, &lock_key("notified"));
    let (_guard, late) = took(
        waiter,
        released,
        "redlock, DEL on a quorum, notifications on",
    )
    .await;
    assert!(
        late < BY_NOTIFICATION,
        "the keyspace notifications did not wake the waiter: it held the lock {late:?} after the DELs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recheck_off_without_notifications_wakes_only_at_the_holders_expiry() {
    let set = RedisSet::start(MASTERS);
    let backend = connect(&format!("{}?recheck_ms=0", set.url())).await;
    let key = lock_key("no-recheck");
    hold_foreign(&set, &key, SHORT_FOREIGN_TTL);
    let started = Instant::now();
    let waiter = wait_for("no-recheck", backend);
    tokio::time::sleep(Duration::from_millis(500)).await;
    del_on_quorum(&set, &key);
    let _guard =
        woke_at_the_holders_expiry(waiter, started, "redlock, recheck_ms=0, no notifications")
            .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_blocked_by_a_quorum_is_not_woken_by_its_own_undo() {
    // The foreign holder has three of five masters; the other two are free,
    // so a round wins them and undoes that at once. The undo announces
    // itself there (the release script's PUBLISH, and a keyspace `del` with
    // notifications on); a waiter that heeded it ran round after round (80 a
    // second seen) until the holder let go. (How long such a run lasts is
    // luck: it ends when a round is decided before a free master answers,
    // which with three blockers of five is rare.)
    let set = RedisSet::try_start_with(
        5,
        RedisOptions::new().config(["--notify-keyspace-events", "Kgx"]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let backend = connect(&set.url()).await;
    let key = lock_key("own-undo");
    for server in &set.servers()[..3] {
        assert_eq!(
            server.redis_cli(&["SET", &key, "not-dlock", "PX", "10000"]),
            "OK"
        );
    }
    let wait = Duration::from_secs(3);
    let outcome = Lock::new("own-undo")
        .with_backend(backend)
        .ttl(Duration::from_secs(5))
        .wait(wait)
        .acquire()
        .await;
    assert!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "{outcome:?}"
    );
    let scripts: u64 = set.servers()[3..]
        .iter()
        .map(|free| {
            let stats = free.redis_cli(&["INFO", "commandstats"]);
            stats
                .lines()
                .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse().expect("a call count"))
        })
        .sum();
    println!("the free masters ran {scripts} acquire and undo scripts in {wait:?}");
    // Two rounds (before and after subscribing), each an acquire and its
    // undo on two masters: 8.
    assert!(
        scripts <= 12,
        "the waiter kept running rounds on its own undo: {scripts} scripts on the free masters in {wait:?}"
    );
}
