//! Acquisitions cancelled mid-wait (issue 68): a lock or permit wait cut
//! short by its caller (`tokio::time::timeout`) leaves the server's queue
//! at once and costs no connection. dlock ends the waiting statement with
//! `KILL QUERY` from another of its own sessions and puts the waiting
//! session back in its pool (see `dlock/src/backends/mysql/cancel.rs`).
//!
//! Measured through one checking connection of the test's own, opened
//! before the first count: the statements waiting in `GET_LOCK` just before
//! each cancel and 100 ms after it (`information_schema.PROCESSLIST`; the
//! sessions' lifeline watchers, `/* dlock lifeline */`, are not waiters),
//! the server's `Connections` counter before and after, and the lines the
//! server wrote to its log meanwhile (MariaDB 10.11 logs every aborted
//! connection: `log_warnings` is 2). The numbers are printed; the counts
//! asserted are the targets, with no timed assertion.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::mysql::{lock_name, MysqlBackend};
use dlock::{Lock, LockBackend, Semaphore};
use dlock_tests::fixtures::mysql::{sql_string, MysqlFixture};
use dlock_tests::shared::{turns_dropped, Take};
use dlock_tests::sql_servers::connected;
use mysql_async::prelude::Queryable;

/// Waits at once, each on a waiting session of its own (`?sessions=`).
const AT_ONCE: usize = 8;
/// Keys the lock waiters queue for, one waiter each (a process's waiters
/// of one key queue in the process, and one of them in the server).
const KEYS: usize = AT_ONCE;
/// Semaphores the permit waiters queue for: two waiters each, of two
/// clients (one head waiter watching the slot, one in the door's queue).
const SEMAPHORES: usize = AT_ONCE / 2;
/// Lock waits cancelled mid-wait in all (a waiter granted in a race round
/// before its cut is not counted: rounds go on until this many).
const LOCK_CANCELS: usize = 1000;
/// The most rounds of [`AT_ONCE`] lock waits (125 when none is granted).
const LOCK_ROUNDS: usize = 140;
/// Rounds of cancelled permit waits: 200 in all.
const PERMIT_ROUNDS: usize = 25;
/// How long a wait runs before its caller leaves.
const CUT_AFTER: Duration = Duration::from_millis(60);
/// When, in a wait, the waiters in the server are counted.
const COUNT_AT: Duration = Duration::from_millis(40);
/// How long after the cancels the server is looked at again.
const SETTLE: Duration = Duration::from_millis(100);

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    connected(url, MysqlBackend::connect).await
}

/// The test's checking connection.
async fn checker(fixture: &MysqlFixture) -> mysql_async::Conn {
    let opts = mysql_async::Opts::from_url(&fixture.server().url()).expect("the harness URL");
    mysql_async::Conn::new(opts)
        .await
        .expect("the checking connection")
}

/// Statements of other connections waiting in `GET_LOCK`, lifeline
/// watchers left out.
async fn waiters(conn: &mut mysql_async::Conn) -> u64 {
    conn.query_first(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE ID <> CONNECTION_ID() AND INFO LIKE '%GET_LOCK(%' \
         AND INFO NOT LIKE '%dlock lifeline%'",
    )
    .await
    .expect("PROCESSLIST")
    .unwrap_or(0)
}

/// The server's count of connections opened since it started.
async fn connections(conn: &mut mysql_async::Conn) -> u64 {
    let row: Option<(String, String)> = conn
        .query_first("SHOW GLOBAL STATUS LIKE 'Connections'")
        .await
        .expect("SHOW GLOBAL STATUS");
    row.and_then(|(_, v)| v.parse().ok()).expect("a count")
}

/// The server log's lines, and how many of them are aborted connections.
fn log_lines(log: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let aborted = text
        .lines()
        .filter(|l| l.contains("Aborted connection"))
        .count();
    (text.lines().count(), aborted)
}

/// What the server showed over a run of cancelled waits.
#[derive(Default)]
struct Tally {
    cancelled: usize,
    granted: usize,
    raced: usize,
    queued_before: u64,
    left_after: u64,
    /// Waiters still in the server 5 s after the last cancel.
    left_at_end: u64,
    /// The longest a key granted in a race with its cancel stayed held.
    slowest_let_go: Duration,
    held_after: u64,
    connections: u64,
    log_lines: usize,
    aborted: usize,
    took: Duration,
}

impl Tally {
    fn print(&self, what: &str) {
        eprintln!(
            "{what}: {} cancelled mid-wait ({} granted before the cancel instead; {} keys let go \
             at the cut, then taken at once), in {:.1} s; \
             waiting in GET_LOCK just before the cancels: {} in all; 100 ms after: {}; \
             5 s after the last: {}; a raced key free after at most {:?}; left held: {}; \
             new connections: {}; server log: {} lines ({} aborted connections)",
            self.cancelled,
            self.granted,
            self.raced,
            self.took.as_secs_f64(),
            self.queued_before,
            self.left_after,
            self.left_at_end,
            self.slowest_let_go,
            self.held_after,
            self.connections,
            self.log_lines,
            self.aborted
        );
    }

    fn assert_targets(&self, what: &str) {
        // 100 ms is the figure, printed; asserted with room for a
        // loaded machine (8 tests at once on 2 cores), where a cancel's
        // `KILL QUERY` can be sent late: at most 2 % of the cancelled waits
        // still queued at 100 ms, none 5 s after the last. Before: every
        // cancelled wait stayed until its connection was closed.
        assert!(
            self.left_after * 50 <= self.cancelled as u64,
            "{what}: {} of {} cancelled waits still in the server 100 ms after their cancel",
            self.left_after,
            self.cancelled
        );
        assert_eq!(self.left_at_end, 0, "{what}: waiters left in the server");
        assert_eq!(self.held_after, 0, "{what}: locks left held");
        // 0 in a quiet run (printed); at most 1 % on a loaded machine (a
        // `KILL QUERY` unanswered in time retires its session). Before: a
        // connection per cancel.
        assert!(
            self.connections * 100 <= self.cancelled as u64,
            "{what}: {} new connections for {} cancels",
            self.connections,
            self.cancelled
        );
        assert!(
            self.aborted * 100 <= self.cancelled,
            "{what}: {} aborted connections logged for {} cancels",
            self.aborted,
            self.cancelled
        );
        assert!(self.log_lines <= 10, "{what}: {} log lines", self.log_lines);
    }
}

/// The waiters in the server once they are gone, or after 5 s.
async fn waiters_after_settling(check: &mut mysql_async::Conn) -> u64 {
    let start = Instant::now();
    loop {
        let left = waiters(check).await;
        if left == 0 || start.elapsed() > Duration::from_secs(5) {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The connection id holding `key`'s lock name, if any.
async fn holder_of(conn: &mut mysql_async::Conn, key: &str) -> Option<u64> {
    let name = sql_string(&lock_name(dlock_tests::servers::mariadb::DATABASE, key));
    let id: Option<Option<u64>> = conn
        .query_first(format!("SELECT IS_USED_LOCK({name})"))
        .await
        .expect("IS_USED_LOCK");
    id.flatten()
}

/// How many of `keys` are held by a session other than their `holders`
/// (`None`: nobody should hold it).
async fn held_by_others(
    conn: &mut mysql_async::Conn,
    keys: &[String],
    holders: &[Option<u64>],
) -> u64 {
    let mut n = 0;
    for (key, holder) in keys.iter().zip(holders) {
        if let Some(id) = holder_of(conn, key).await {
            if Some(id) != *holder {
                n += 1;
            }
        }
    }
    n
}

/// 1,000 lock waits cut short while queued behind a holder (8 at once on
/// 8 keys); in every tenth round the holder lets one key go 0–6 ms before
/// the cut, so that a grant races the cancel (a waiter granted first keeps
/// its guard and releases it; one granted as it is cancelled is let go by
/// dlock): that key is then free (`IS_USED_LOCK` NULL) and another client
/// takes it without waiting. 100 ms after each round's cancels: no waiter
/// left in the server and no key held by anyone but the holder; over the
/// whole run (once warm) no new connection, no aborted connection logged
/// and at most 10 log lines. Then a control: the server's log shows a
/// client that left mid-statement, so the log counts can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_lock_waits_leave_the_queue_without_new_connections() {
    let fixture = MysqlFixture::with_options(&format!("sessions={AT_ONCE}"));
    let holder = connect(fixture.url()).await;
    let waiting = connect(fixture.url()).await;
    let keys: Vec<String> = (0..KEYS).map(|k| format!("cancelled-{k}")).collect();
    fill_lock_sessions(&holder).await;
    fill_lock_sessions(&waiting).await;
    // Warm: every waiting session opened and carrying a lease once (its
    // lifeline watcher started), as in a long-running process.
    let mut warm = Vec::new();
    for i in 0..AT_ONCE {
        warm.push(
            Lock::new(format!("warm-{i}"))
                .with_backend(holder.clone())
                .acquire()
                .await
                .unwrap(),
        );
    }
    let mut warming = Vec::new();
    for i in 0..AT_ONCE {
        let lock = Lock::new(format!("warm-{i}"))
            .with_backend(waiting.clone())
            .wait(Duration::from_secs(10));
        warming.push(tokio::spawn(async move { lock.acquire().await }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for guard in warm {
        guard.release().await.unwrap();
    }
    for w in warming {
        w.await.unwrap().unwrap().release().await.unwrap();
    }
    let mut held = Vec::new();
    for key in &keys {
        held.push(Some(hold(&holder, key).await));
    }
    let mut check = checker(&fixture).await;
    let mut holders = Vec::new();
    for key in &keys {
        holders.push(holder_of(&mut check, key).await);
    }
    // One round unmeasured: the waiters' names marked as contended.
    let _ = lock_round(&waiting, &keys, None, &mut held).await;
    tokio::time::sleep(SETTLE).await;

    let log = fixture.server().dir().join("mariadb.log");
    let (lines0, aborted0) = log_lines(&log);
    let connections0 = connections(&mut check).await;
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut rounds = 0;
    for round in 0..LOCK_ROUNDS {
        if tally.cancelled >= LOCK_CANCELS {
            break;
        }
        rounds += 1;
        // Let go 0..=6 ms before the cut: some grants land before it,
        // some as it happens.
        let race = (round % 10 == 9).then_some(round / 10 % KEYS);
        let before = Duration::from_millis((round / 10 % 7) as u64);
        let counting = async {
            tokio::time::sleep(COUNT_AT).await;
            waiters(&mut check).await
        };
        let (outcome, queued) = tokio::join!(
            lock_round(&waiting, &keys, race.map(|k| (k, before)), &mut held),
            counting
        );
        tally.queued_before += queued;
        tally.cancelled += outcome.0;
        tally.granted += outcome.1;
        tokio::time::sleep(SETTLE).await;
        tally.left_after += waiters(&mut check).await;
        if let Some(k) = race {
            // Let go by the holder, and by a waiter granted in the race:
            // nobody holds it within a bound (the let-go runs in the
            // background after the caller left: late on a loaded machine,
            // never missing), and another client then takes it at once.
            let start = Instant::now();
            while holder_of(&mut check, &keys[k]).await.is_some()
                && start.elapsed() < Duration::from_secs(5)
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tally.slowest_let_go = tally.slowest_let_go.max(start.elapsed());
            tally.held_after += held_by_others(&mut check, &keys[k..=k], &[None]).await;
            held[k] = Some(take_at_once(&holder, &keys[k]).await);
            holders[k] = holder_of(&mut check, &keys[k]).await;
            tally.raced += 1;
        }
        tally.held_after += held_by_others(&mut check, &keys, &holders).await;
    }
    tally.left_at_end = waiters_after_settling(&mut check).await;
    tally.took = started.elapsed();
    let connections1 = connections(&mut check).await;
    tally.connections = connections1 - connections0;
    let (lines1, aborted1) = log_lines(&log);
    tally.log_lines = lines1 - lines0;
    tally.aborted = aborted1 - aborted0;
    tally.print(&format!("lock waits ({rounds} rounds of {AT_ONCE})"));
    if tally.log_lines > 0 {
        eprintln!("{}", tail(&log, tally.log_lines.min(5)));
    }
    tally.assert_targets("lock waits");
    assert!(tally.cancelled >= LOCK_CANCELS, "too few cancelled waits");
    assert!(
        tally.queued_before >= (tally.cancelled / 2) as u64,
        "the waits were not in the server's queue when cut: {} seen of {}",
        tally.queued_before,
        tally.cancelled
    );
    for guard in held.into_iter().flatten() {
        guard.release().await.unwrap();
    }
    log_shows_aborted_connections(&fixture, &mut check, &log).await;
}

/// The counts above can fail: the server logs at MariaDB's default
/// `log_warnings = 2`, and a client that leaves mid-statement (as a closed
/// waiting session did) shows in the log the test reads.
async fn log_shows_aborted_connections(
    fixture: &MysqlFixture,
    check: &mut mysql_async::Conn,
    log: &Path,
) {
    let level: Option<u64> = check
        .query_first("SELECT @@GLOBAL.log_warnings")
        .await
        .expect("log_warnings");
    assert_eq!(level, Some(2), "the test server's log_warnings");
    let (_, aborted0) = log_lines(log);
    let server = fixture.server();
    let mut client = std::process::Command::new(server.client_path())
        .args(["--no-defaults", "-h127.0.0.1", "-uroot"])
        .arg(format!("-P{}", server.port()))
        .args(["-e", "SELECT SLEEP(1)"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the mariadb client");
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.kill().expect("kill the client");
    client.wait().expect("the client's exit");
    let until = Instant::now() + Duration::from_secs(10);
    while log_lines(log).1 == aborted0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = log_lines(log).1 - aborted0;
    eprintln!("control: a client killed mid-statement logged {seen} aborted connection(s)");
    assert!(seen > 0, "the server log shows no aborted connection");
}

/// Every lock session of `backend` opened, and its lifeline watcher
/// started (each carries a lease once), as in a long-running process: the
/// counts that follow see no pool filling up.
async fn fill_lock_sessions(backend: &Arc<dyn LockBackend>) {
    let mut guards = Vec::new();
    for i in 0..AT_ONCE {
        let lock = Lock::new(format!("fill-{i}")).with_backend(backend.clone());
        guards.push(lock.acquire().await.unwrap());
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// `key` taken through `holder` for two minutes without waiting (a key
/// nobody holds: a grant raced by a cancel was let go).
async fn take_at_once(holder: &Arc<dyn LockBackend>, key: &str) -> dlock::LockGuard {
    Lock::new(key)
        .with_backend(holder.clone())
        .ttl(Duration::from_secs(120))
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("{key} could not be taken: {e}"))
        .unwrap_or_else(|| panic!("{key} is still held after the cancels"))
}

/// `key` held through `holder` for two minutes (a wait of 5 s at most:
/// a key the test let go is free again at once).
async fn hold(holder: &Arc<dyn LockBackend>, key: &str) -> dlock::LockGuard {
    Lock::new(key)
        .with_backend(holder.clone())
        .ttl(Duration::from_secs(120))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{key} could not be held: {e}"))
}

/// One round: [`AT_ONCE`] waiters on the keys, cut after [`CUT_AFTER`];
/// with `race` (a key, how long before the cut), the holder lets that key
/// go. Answers
/// how many were cancelled and how many granted (then released).
async fn lock_round(
    waiting: &Arc<dyn LockBackend>,
    keys: &[String],
    race: Option<(usize, Duration)>,
    held: &mut [Option<dlock::LockGuard>],
) -> (usize, usize) {
    let mut tasks = Vec::new();
    for i in 0..AT_ONCE {
        let lock = Lock::new(keys[i % keys.len()].clone())
            .with_backend(waiting.clone())
            .wait(Duration::from_secs(10));
        tasks.push(tokio::spawn(async move {
            tokio::time::timeout(CUT_AFTER, lock.acquire()).await
        }));
    }
    if let Some((k, before)) = race {
        tokio::time::sleep(CUT_AFTER.saturating_sub(before)).await;
        let guard = held[k].take().expect("the key is held");
        guard.release().await.unwrap();
    }
    let (mut cancelled, mut granted) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Err(_elapsed) => cancelled += 1,
            Ok(guard) => {
                granted += 1;
                guard.unwrap().release().await.unwrap();
            }
        }
    }
    (cancelled, granted)
}

/// 200 permit waits cut short (4 semaphores of one permit, held; two
/// clients wait for each, 8 waits at once: one in the head waiter's watch
/// of the slot, one in the door's queue): no waiter left in the server
/// 100 ms after each round, no new connection, no log line; then the
/// holder's releases serve new waiters (no door left held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_permit_waits_leave_the_queue_without_new_connections() {
    let fixture = MysqlFixture::with_options(&format!("sessions={AT_ONCE}"));
    let holder = connect(fixture.url()).await;
    let clients = [connect(fixture.url()).await, connect(fixture.url()).await];
    let names: Vec<String> = (0..SEMAPHORES).map(|s| format!("cancelled-{s}")).collect();
    let mut permits = Vec::new();
    for name in &names {
        permits.push(
            Semaphore::new(name.clone(), 1)
                .with_backend(holder.clone())
                .ttl(Duration::from_secs(120))
                .acquire()
                .await
                .unwrap(),
        );
    }
    for client in &clients {
        fill_lock_sessions(client).await;
    }
    let mut check = checker(&fixture).await;
    // Warm: the waiting sessions opened.
    for _ in 0..3 {
        permit_round(&clients, &names).await;
        tokio::time::sleep(SETTLE).await;
    }
    let log = fixture.server().dir().join("mariadb.log");
    let (lines0, aborted0) = log_lines(&log);
    let connections0 = connections(&mut check).await;
    let started = Instant::now();
    let mut tally = Tally::default();
    for _ in 0..PERMIT_ROUNDS {
        let counting = async {
            tokio::time::sleep(COUNT_AT).await;
            waiters(&mut check).await
        };
        let (cancelled, queued) = tokio::join!(permit_round(&clients, &names), counting);
        tally.cancelled += cancelled;
        tally.queued_before += queued;
        tokio::time::sleep(SETTLE).await;
        tally.left_after += waiters(&mut check).await;
    }
    tally.left_at_end = waiters_after_settling(&mut check).await;
    tally.took = started.elapsed();
    tally.connections = connections(&mut check).await - connections0;
    let (lines1, aborted1) = log_lines(&log);
    tally.log_lines = lines1 - lines0;
    tally.aborted = aborted1 - aborted0;
    tally.print(&format!(
        "permit waits ({PERMIT_ROUNDS} rounds of {AT_ONCE})"
    ));
    if tally.log_lines > 0 {
        eprintln!("{}", tail(&log, tally.log_lines.min(5)));
    }
    let mut next = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let one = Semaphore::new(name.clone(), 1)
            .with_backend(clients[i % 2].clone())
            .wait(Duration::from_secs(10));
        next.push(tokio::spawn(async move { one.acquire().await }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for permit in permits {
        permit.release().await.unwrap();
    }
    for n in next {
        n.await
            .unwrap()
            .expect("a new waiter is served after the cancelled ones")
            .release()
            .await
            .unwrap();
    }
    tally.assert_targets("permit waits");
}

/// One round of [`AT_ONCE`] permit waits (two per semaphore, one from
/// each client) cut after [`CUT_AFTER`]: how many were cancelled (the
/// permits are held throughout).
async fn permit_round(clients: &[Arc<dyn LockBackend>; 2], names: &[String]) -> usize {
    let mut tasks = Vec::new();
    for i in 0..AT_ONCE {
        let one = Semaphore::new(names[i / 2].clone(), 1)
            .with_backend(clients[i % 2].clone())
            .wait(Duration::from_secs(10));
        tasks.push(tokio::spawn(async move {
            tokio::time::timeout(CUT_AFTER, one.acquire()).await
        }));
    }
    let mut cancelled = 0;
    for t in tasks {
        if t.await.unwrap().is_err() {
            cancelled += 1;
        }
    }
    cancelled
}

/// Lock waits dropped just as their turn comes, 160 rounds (the shared
/// suite runs 40): a cancel's `KILL QUERY` that lands after the grant
/// (between two statements of one request, before the fix: `cancel.rs`)
/// leaves nothing held, and the next holder is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_dropped_as_their_turn_comes_are_given_back_at_once() {
    let fixture = MysqlFixture::start();
    turns_dropped(&fixture, Take::Lock, 160).await;
}

/// The same for a permit's head waiter (its watch of the slot) and the
/// door's queue, 160 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_waits_dropped_as_their_turn_comes_are_given_back_at_once() {
    let fixture = MysqlFixture::start();
    turns_dropped(&fixture, Take::Permit, 160).await;
}

/// The last `n` lines of the server's log.
fn tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
