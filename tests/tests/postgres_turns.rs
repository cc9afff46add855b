//! PostgreSQL waiters take turns in the server's own queue of the advisory
//! lock: waiters in separate processes are served in the order they
//! arrived, a waiter whose process is killed does not stall the one behind
//! it, and SQL's own `pg_advisory_lock` on the same key waits in the same
//! queue (neither starved nor overlapping a dlock holder).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::postgres::{advisory_key, PostgresBackend};
use dlock::{Lock, LockBackend, LockGuard};
use dlock_tests::holder::{Holder, HolderSpec};
use dlock_tests::servers::postgres::PgServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const HOLDER: &str = env!("CARGO_BIN_EXE_lock-holder");
const TTL: Duration = Duration::from_secs(5);

async fn hold(server: &PgServer, key: &str) -> (Arc<dyn LockBackend>, LockGuard) {
    let backend: Arc<dyn LockBackend> =
        Arc::new(PostgresBackend::connect(&server.url()).await.unwrap());
    let guard = Lock::new(key)
        .with_backend(backend.clone())
        .ttl(TTL)
        .try_acquire()
        .await
        .unwrap()
        .expect("the key is free");
    (backend, guard)
}

/// The `pg_locks` condition of the plain lock `key`, granted or waiting.
fn lock_rows(key: &str) -> String {
    let id = advisory_key(key);
    format!(
        "locktype = 'advisory' AND objsubid = 1 \
         AND classid = (({id}::int8 >> 32) & 4294967295)::oid AND objid = ({id}::int8 & 4294967295)::oid"
    )
}

/// How many sessions wait in the server's queue of `key`.
fn queued(server: &PgServer, key: &str) -> usize {
    server
        .psql(&format!(
            "SELECT count(*) FROM pg_locks WHERE {} AND NOT granted",
            lock_rows(key)
        ))
        .parse()
        .expect("a count")
}

/// Waits (at most 20 s) until `n` sessions wait for `key`.
async fn until_queued(server: &PgServer, key: &str, n: usize) {
    let start = Instant::now();
    while queued(server, key) != n {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{n} waiters never queued for {key} (now {})",
            queued(server, key)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn waiter(server: &PgServer, key: &str, hold: Duration, marks: Option<&std::path::Path>) -> Holder {
    Holder::spawn(
        HOLDER,
        &HolderSpec {
            url: server.url(),
            key: key.to_owned(),
            ttl: TTL,
            hold,
            cycles: 1,
            marks: marks.map(std::path::Path::to_path_buf),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_in_separate_processes_are_served_in_arrival_order() {
    const WAITERS: usize = 5;
    let server = PgServer::start();
    let key = "turns:order";
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    let (_backend, first) = hold(&server, key).await;
    let mut waiters = Vec::new();
    let mut arrived = Vec::new();
    for i in 0..WAITERS {
        let w = waiter(&server, key, Duration::from_millis(50), Some(&marks));
        arrived.push(w.pid().expect("the waiter runs"));
        waiters.push(w);
        until_queued(&server, key, i + 1).await;
    }
    first.release().await.unwrap();
    for w in &mut waiters {
        w.finish(Duration::from_secs(30)).await;
    }
    let text = std::fs::read_to_string(&marks).unwrap();
    assert_eq!(dlock_tests::holder::check_marks(&text), WAITERS);
    let served: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("start "))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(served, arrived, "served in another order than arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiter_does_not_stall_the_next() {
    let server = PgServer::start();
    let key = "turns:killed";
    let (_backend, first) = hold(&server, key).await;
    let mut doomed = waiter(&server, key, Duration::from_secs(30), None);
    until_queued(&server, key, 1).await;
    let mut next = waiter(&server, key, Duration::from_millis(50), None);
    until_queued(&server, key, 2).await;
    doomed.kill9().await;
    // Released at once: the killed waiter's server process may still be
    // in the queue, ahead of the live one.
    let released = Instant::now();
    first.release().await.unwrap();
    next.acquired(Duration::from_secs(10)).await;
    let waited = released.elapsed();
    eprintln!("the live waiter was served {waited:?} after the release");
    assert!(
        waited < Duration::from_secs(2),
        "the killed waiter stalled the queue for {waited:?}"
    );
    next.finish(Duration::from_secs(10)).await;
    // And a waiter killed long before its turn leaves the queue by itself.
    let (_backend2, again) = hold(&server, key).await;
    let mut doomed = waiter(&server, key, Duration::from_secs(30), None);
    until_queued(&server, key, 1).await;
    doomed.kill9().await;
    let killed = Instant::now();
    until_queued(&server, key, 0).await;
    eprintln!(
        "a killed waiter left the queue {:?} after its kill",
        killed.elapsed()
    );
    again.release().await.unwrap();
}

/// A psql session that asks for `pg_advisory_lock(id)` (waiting in the
/// server's queue) and prints `locked` once granted; it unlocks and quits
/// when its stdin closes.
struct SqlWaiter {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl SqlWaiter {
    async fn ask(server: &PgServer, id: i64) -> Self {
        let mut child = Command::new(server.psql_path())
            .args(["-h", "127.0.0.1", "-p"])
            .arg(server.port().to_string())
            .args(["-U", "postgres", "-d", "postgres", "-XAtq"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start psql");
        let stdin = child.stdin.as_mut().expect("psql stdin");
        stdin
            .write_all(format!("SELECT pg_advisory_lock({id}); SELECT 'locked';\n").as_bytes())
            .await
            .expect("write to psql");
        stdin.flush().await.expect("flush psql");
        let stdout = child.stdout.take().expect("psql stdout");
        SqlWaiter {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Whether psql says `locked` within `limit`.
    async fn locked_within(&mut self, limit: Duration) -> bool {
        let read = async {
            while let Some(line) = self.lines.next_line().await.expect("read psql") {
                if line.trim() == "locked" {
                    return true;
                }
            }
            false
        };
        tokio::time::timeout(limit, read).await.unwrap_or(false)
    }

    async fn quit(mut self) {
        drop(self.child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_pg_advisory_lock_waits_in_the_same_queue() {
    let server = PgServer::start();
    let key = "turns:sql";
    let id = advisory_key(key);
    let (_backend, first) = hold(&server, key).await;
    // SQL first in the queue, a dlock process behind it.
    let mut sql = SqlWaiter::ask(&server, id).await;
    until_queued(&server, key, 1).await;
    let mut dlock_waiter = waiter(&server, key, Duration::from_millis(1500), None);
    until_queued(&server, key, 2).await;
    first.release().await.unwrap();
    assert!(
        sql.locked_within(Duration::from_secs(5)).await,
        "SQL's pg_advisory_lock was not served in its turn"
    );
    // The dlock waiter stays out while SQL holds the lock.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(queued(&server, key), 1, "the dlock waiter left the queue");
    let sql_released = Instant::now();
    sql.quit().await;
    dlock_waiter.acquired(Duration::from_secs(10)).await;
    let waited = sql_released.elapsed();
    eprintln!("the dlock waiter was served {waited:?} after SQL's unlock");
    assert!(waited < Duration::from_secs(2), "served {waited:?} late");
    // SQL behind a dlock holder is served at its release.
    let mut sql = SqlWaiter::ask(&server, id).await;
    until_queued(&server, key, 1).await;
    assert!(
        sql.locked_within(Duration::from_secs(10)).await,
        "SQL behind a dlock holder was starved"
    );
    dlock_waiter.finish(Duration::from_secs(10)).await;
    sql.quit().await;
}
