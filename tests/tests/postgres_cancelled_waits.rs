//! A PostgreSQL wait dropped by its caller leaves the server's queue as
//! its caller leaves, on the connections dlock already has, and the server
//! logs nothing for it (issue 68: each cancelled wait used to stay queued
//! until its `lock_timeout`, cost a connection, and log four lines). And
//! dlock never asks the server to unlock an advisory lock its session does
//! not hold (the server's `WARNING: you don't own a lock of type …`), nor
//! cuts a connection it was opening when an attempt is dropped.
//!
//! What the server logged is read from its log file, at the default
//! `log_min_messages` and `log_min_error_statement`; what waits, and which
//! connections exist, through a direct connection of the test's own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::postgres::{advisory_key, PostgresBackend};
use dlock::{Lock, LockBackend, LockError, RwLock};
use dlock_tests::servers::postgres::PgServer;
use tokio_postgres::Client;

/// The most waits the first test cancels, and the time it may take for
/// them (a slow machine runs fewer; the test prints how many).
const CANCELS: usize = 1_000;
const CANCEL_BUDGET: Duration = Duration::from_secs(45);

/// How long after each cancel the server is asked whether it still waits.
const AFTER_CANCEL: Duration = Duration::from_millis(100);

async fn direct(server: &PgServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("a direct connection");
    tokio::spawn(connection);
    client
}

/// The sessions waiting for the plain lock `key` in the server's queue.
async fn waiting_for(client: &Client, key: &str) -> i64 {
    let id = advisory_key(key);
    let sql = format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND NOT granted \
         AND classid = (({id}::int8 >> 32) & 4294967295)::oid AND objid = ({id}::int8 & 4294967295)::oid"
    );
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

/// The server processes of client connections, but the test's own.
async fn client_pids(client: &Client) -> HashSet<i32> {
    let sql = "SELECT pid FROM pg_stat_activity \
               WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
    client
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The log's length now: where a later [`log_since`] starts.
fn log_len(server: &PgServer) -> u64 {
    std::fs::metadata(server.log_path()).map_or(0, |m| m.len())
}

/// The lines the server logged after `from` (a [`log_len`]).
fn log_since(server: &PgServer, from: u64) -> Vec<String> {
    let bytes = std::fs::read(server.log_path()).unwrap_or_default();
    let start = usize::try_from(from).unwrap().min(bytes.len());
    String::from_utf8_lossy(&bytes[start..])
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn connect(server: &PgServer) -> Arc<dyn LockBackend> {
    Arc::new(PostgresBackend::connect(&server.url()).await.unwrap())
}

/// Drives `acquire` until the server shows one waiter for `key`, then
/// drops it: a wait cancelled in the server's queue. False if the waiter
/// never showed within 5 s.
async fn cancel_once_queued(direct: &Client, backend: &Arc<dyn LockBackend>, key: &str) -> bool {
    let lock = Lock::new(key)
        .with_backend(backend.clone())
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    let acquire = lock.acquire();
    let mut acquire = std::pin::pin!(acquire);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        tokio::select! {
            answer = &mut acquire => panic!("a wait for a held key ended: {:?}", answer.map(|_| ())),
            () = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
        if waiting_for(direct, key).await == 1 {
            return true;
        }
    }
    false
}

/// What one task of the first test counted.
#[derive(Debug, Default)]
struct Tally {
    cancelled: usize,
    never_queued: usize,
    /// Waiters still in the queue [`AFTER_CANCEL`] after a cancel, summed.
    left_after: i64,
    most_left: i64,
    /// Cancels after which a waiter was still queued [`AFTER_CANCEL`] later.
    late: usize,
    new_pids: HashSet<i32>,
}

/// Cancels waits for `key` until `budget` runs out or `count` says
/// [`CANCELS`] were done.
async fn cancel_waits(
    direct: Arc<Client>,
    backend: Arc<dyn LockBackend>,
    key: String,
    before: Arc<HashSet<i32>>,
    count: Arc<std::sync::atomic::AtomicUsize>,
    until: Instant,
) -> Tally {
    use std::sync::atomic::Ordering;
    let mut tally = Tally::default();
    while Instant::now() < until && count.fetch_add(1, Ordering::SeqCst) < CANCELS {
        if !cancel_once_queued(&direct, &backend, &key).await {
            tally.never_queued += 1;
            continue;
        }
        let pids = client_pids(&direct).await;
        tally.new_pids.extend(pids.difference(&before));
        tally.cancelled += 1;
        tokio::time::sleep(AFTER_CANCEL).await;
        let left = waiting_for(&direct, &key).await;
        tally.left_after += left;
        tally.most_left = tally.most_left.max(left);
        tally.late += usize::from(left > 0);
    }
    tally
}

/// Keys waited for at once (below `?sessions=`, so that a wait always
/// finds an idle waiting session while another one is still leaving).
const TASKS: usize = 6;

/// `?sessions=`: the waiting sessions are all opened before the count
/// starts, by as many waits at once.
const SESSIONS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_the_queue_on_the_same_connections_and_logs_nothing() {
    let server = PgServer::start();
    let direct = Arc::new(direct(&server).await);
    let keys: Vec<String> = (0..SESSIONS).map(|i| format!("cancelled:{i}")).collect();
    let backend: Arc<dyn LockBackend> = Arc::new(
        PostgresBackend::connect(&format!("{}?sessions={SESSIONS}", server.url()))
            .await
            .unwrap(),
    );
    // The holders on a backend of their own: a backend's waiters queue
    // locally behind its own holder of the key, and never reach the server.
    let holding = connect(&server).await;
    let mut holders = Vec::new();
    for key in &keys {
        let guard = Lock::new(key.as_str())
            .with_backend(holding.clone())
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await
            .unwrap()
            .expect("the key is free");
        holders.push(guard);
    }
    // One wait per key first, all in the queue at once, then all dropped:
    // every waiting session is open from then on. One after the other, so
    // that each finds its waiting session (many at once may find the pool
    // still opening and wait on the re-checking path instead).
    let mut warm = Vec::new();
    for key in &keys {
        let lock = Lock::new(key.as_str())
            .with_backend(backend.clone())
            .wait(Duration::from_secs(60));
        warm.push(tokio::spawn(
            async move { lock.acquire().await.map(|_| ()) },
        ));
        let start = Instant::now();
        while waiting_for(&direct, key).await != 1 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{key} never queued"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    warm.iter().for_each(tokio::task::JoinHandle::abort);
    // The lock sessions too: the pool grows when tries overlap, which is
    // not what a cancel costs. Bounded: SESSIONS tasks of 40 refused tries.
    let tries: Vec<_> = (0..SESSIONS)
        .map(|i| {
            let lock = Lock::new(keys[i % keys.len()].as_str()).with_backend(backend.clone());
            tokio::spawn(async move {
                for _ in 0..40 {
                    assert!(lock.try_acquire().await.unwrap().is_none(), "a held key");
                }
            })
        })
        .collect();
    for t in tries {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = Arc::new(client_pids(&direct).await);
    let log_from = log_len(&server);
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = keys[..TASKS]
        .iter()
        .map(|key| {
            tokio::spawn(cancel_waits(
                direct.clone(),
                backend.clone(),
                key.clone(),
                before.clone(),
                count.clone(),
                start + CANCEL_BUDGET,
            ))
        })
        .collect();
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.unwrap();
        all.cancelled += t.cancelled;
        all.never_queued += t.never_queued;
        all.left_after += t.left_after;
        all.most_left = all.most_left.max(t.most_left);
        all.late += t.late;
        all.new_pids.extend(t.new_pids);
    }
    let took = start.elapsed();
    // Whatever is left leaves within 5 s (a bound, not a measure).
    let settle = Instant::now();
    let mut left_at_end = 0;
    for key in &keys {
        while waiting_for(&direct, key).await > 0 && settle.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        left_at_end += waiting_for(&direct, key).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = client_pids(&direct).await;
    all.new_pids.extend(after.difference(&before));
    let lines = log_since(&server, log_from);
    println!(
        "{} waits cancelled in the server's queue in {took:?} by {TASKS} tasks ({} never showed \
         there); {AFTER_CANCEL:?} after each cancel, waiters left in all: {} (at most {} for a \
         key); left after 5 s: {left_at_end}; client connections before: {}, after: {}, new ones \
         seen: {}; server log lines: {}",
        all.cancelled,
        all.never_queued,
        all.left_after,
        all.most_left,
        before.len(),
        after.len(),
        all.new_pids.len(),
        lines.len()
    );
    for line in lines.iter().take(12) {
        println!("  log: {line}");
    }
    assert_eq!(
        all.never_queued, 0,
        "a wait never reached the server's queue"
    );
    // The 100 ms is the figure, printed above; asserted with room
    // for a loaded machine (8 tests at once on 2 cores), where a cancel's
    // task can be scheduled late: at most 2 % of the cancels, and every
    // wait gone within the 5 s below. Before, every cancelled wait stayed
    // queued until its `lock_timeout`.
    assert!(
        all.late * 50 <= all.cancelled,
        "{} of {} cancelled waits were still in the server's queue {AFTER_CANCEL:?} after their cancel",
        all.late,
        all.cancelled
    );
    assert_eq!(
        left_at_end, 0,
        "a cancelled wait stayed in the server's queue"
    );
    // 0 in a quiet run (printed above); a loaded machine can make the
    // pool's tries overlap more than in the warm-up, and the pool then
    // opens a session up to `?sessions=`, which is not a cancel's cost.
    // Before: a connection per cancel.
    assert!(
        all.new_pids.len() <= SESSIONS,
        "cancels opened {} connections",
        all.new_pids.len()
    );
    assert!(lines.len() <= 10, "the server logged {} lines", lines.len());
    // The waiting sessions still serve: a wait granted by the release.
    let key = keys[0].clone();
    let waiter = {
        let backend = backend.clone();
        let key = key.clone();
        tokio::spawn(async move {
            Lock::new(key)
                .with_backend(backend)
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    let queued = Instant::now();
    while waiting_for(&direct, &key).await != 1 {
        assert!(
            queued.elapsed() < Duration::from_secs(10),
            "the last wait never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holders.remove(0).release().await.unwrap();
    let guard = waiter.await.unwrap().expect("granted by the release");
    guard.release().await.unwrap();
    assert_eq!(
        client_pids(&direct).await,
        after,
        "the last wait opened a connection"
    );
}

/// The lines of `lines` that say dlock let go of a lock it did not hold.
fn not_owned(lines: &[String]) -> Vec<&String> {
    lines
        .iter()
        .filter(|l| l.contains("you don't own a lock"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_unlock_of_a_lock_the_session_does_not_hold() {
    const ROUNDS: usize = 60;
    let server = PgServer::start();
    let (holding, asking) = (connect(&server).await, connect(&server).await);
    let key = "not-owned:plain";
    let rw_key = "not-owned:rw";
    let _held = Lock::new(key)
        .with_backend(holding.clone())
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    let _written = RwLock::new(rw_key)
        .with_backend(holding.clone())
        .ttl(Duration::from_secs(30))
        .try_write()
        .await
        .unwrap()
        .expect("free");
    let log_from = log_len(&server);
    let mut timed_out = 0;
    let mut dropped = 0;
    for round in 0..ROUNDS {
        // A wait that runs out in the server's queue.
        let waited = Lock::new(key)
            .with_backend(asking.clone())
            .wait(Duration::from_millis(30))
            .acquire()
            .await;
        assert!(
            matches!(waited, Err(LockError::Timeout { .. })),
            "{waited:?}"
        );
        timed_out += 1;
        // Attempts dropped at varied points of their statement: a try, a
        // read (refused behind the writer) and a write.
        let cut = Duration::from_micros(200 * (round as u64 % 15));
        let lock = Lock::new(key).with_backend(asking.clone());
        dropped += usize::from(tokio::time::timeout(cut, lock.try_acquire()).await.is_err());
        let rw = RwLock::new(rw_key)
            .with_backend(asking.clone())
            .wait(Duration::from_millis(20));
        dropped += usize::from(tokio::time::timeout(cut, rw.read()).await.is_err());
        dropped += usize::from(tokio::time::timeout(cut, rw.write()).await.is_err());
    }
    // The undoing happens in the background: give it time to finish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lines = log_since(&server, log_from);
    let warnings = not_owned(&lines);
    println!(
        "{timed_out} waits timed out, {dropped} attempts dropped mid-flight; \"you don't own a \
         lock\" warnings: {}; server log lines: {}",
        warnings.len(),
        lines.len()
    );
    for line in lines.iter().take(12) {
        println!("  log: {line}");
    }
    assert!(warnings.is_empty(), "dlock unlocked locks it did not hold");
    // A dropped attempt used to cut the connection its pool was opening
    // for it (the listener's too): the server logged the reset.
    let cut: Vec<_> = lines
        .iter()
        .filter(|l| {
            l.contains("could not receive data from client") || l.contains("unexpected EOF")
        })
        .collect();
    assert!(cut.is_empty(), "dropped attempts cut connections: {cut:?}");
    assert!(lines.len() <= 10, "the server logged {} lines", lines.len());
}
