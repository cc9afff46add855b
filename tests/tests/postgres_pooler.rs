//! The PostgreSQL backend behind a real PgBouncer: a transaction or
//! statement pooler is refused by name (no overlap, no advisory lock left
//! behind), a session pooler works as a direct connection does, a killed
//! client's lock is freed through it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend};
use dlock_tests::servers::{PgBouncer, PgServer};

const HOLDER: &str = env!("CARGO_BIN_EXE_lock-holder");

/// What a storm of clients through a pooler saw.
#[derive(Debug, Default)]
struct Storm {
    grants: usize,
    refusals: usize,
    overlaps: usize,
    errors: Vec<String>,
    elapsed: Duration,
}

/// `clients` backends × `tasks` tasks × `cycles` acquisitions of one key
/// through `url` (10 s waits); a task stops at its first error. Bounded by
/// 90 s as a whole.
async fn storm(url: &str, clients: usize, tasks: usize, cycles: usize) -> Storm {
    let started = Instant::now();
    let holders = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Storm::default()));
    let mut backends: Vec<Arc<dyn LockBackend>> = Vec::new();
    let mut joins = Vec::new();
    for _ in 0..clients {
        let backend = match tokio::time::timeout(Duration::from_secs(20), dlock::connect(url)).await
        {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                let mut s = seen.lock().unwrap();
                s.refusals += 1;
                s.errors.push(format!("connect: {e}"));
                continue;
            }
            Err(_) => panic!("connect through the pooler did not finish within 20 s"),
        };
        backends.push(backend.clone());
        for _ in 0..tasks {
            let (backend, holders, seen) = (backend.clone(), holders.clone(), seen.clone());
            joins.push(tokio::spawn(async move {
                for _ in 0..cycles {
                    let lock = Lock::new("pooled-storm")
                        .wait(Duration::from_secs(10))
                        .with_backend(backend.clone());
                    match lock.acquire().await {
                        Ok(guard) => {
                            let overlapped = holders.fetch_add(1, Ordering::SeqCst) > 0;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            holders.fetch_sub(1, Ordering::SeqCst);
                            {
                                let mut s = seen.lock().unwrap();
                                s.grants += 1;
                                s.overlaps += usize::from(overlapped);
                            }
                            if let Err(e) = guard.release().await {
                                let mut s = seen.lock().unwrap();
                                s.refusals += 1;
                                s.errors.push(format!("release: {e}"));
                                return;
                            }
                        }
                        Err(e) => {
                            let mut s = seen.lock().unwrap();
                            s.refusals += 1;
                            s.errors.push(format!("acquire: {e}"));
                            return;
                        }
                    }
                }
            }));
        }
    }
    let all = futures_util::future::join_all(joins);
    tokio::time::timeout(Duration::from_secs(90), all)
        .await
        .expect("every client done or refused within 90 s");
    drop(backends);
    let mut s = std::mem::take(&mut *seen.lock().unwrap());
    s.elapsed = started.elapsed();
    s
}

/// Advisory locks on the server, asked directly (not through the pooler),
/// polled up to 5 s for the dropped backends' connections to close.
fn advisory_locks_left(server: &PgServer) -> String {
    let count = || server.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = count();
    while left != "0" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = count();
    }
    left
}

/// Opens `size` server sessions behind `pooler` (concurrent sleeps), so
/// every one is there to be lent in turn.
fn fill_the_pool(pooler: &PgBouncer, size: usize) {
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            for _ in 0..size {
                scope.spawn(|| pooler.try_psql("SELECT pg_sleep(0.3)"));
            }
        });
    });
}

/// Every error names the pooler and the way out.
fn assert_errors_name_the_pooler(storm: &Storm) {
    for e in &storm.errors {
        assert!(
            e.contains("pooler") && e.contains("pool_mode = session"),
            "an error that does not name the pooler: {e}"
        );
    }
}

async fn refused_under(pool_mode: &str) {
    let server = PgServer::start();
    let pooler = PgBouncer::start(&server, pool_mode);
    let storm = storm(&pooler.url(), 2, 3, 15).await;
    let left = tokio::task::block_in_place(|| advisory_locks_left(&server));
    eprintln!(
        "PgBouncer pool_mode = {pool_mode}, default_pool_size = 2, 2 clients x 3 tasks x 15 cycles: \
         grants {}, refusals {}, overlaps {}, advisory locks left {left}, elapsed {:?}",
        storm.grants, storm.refusals, storm.overlaps, storm.elapsed
    );
    if let Some(first) = storm.errors.first() {
        eprintln!("first error: {first}");
    }
    assert_eq!(storm.overlaps, 0, "two holders at once: {storm:?}");
    assert_eq!(left, "0", "advisory locks left on the server");
    assert!(storm.refusals > 0, "the pooler was not refused: {storm:?}");
    assert!(storm.elapsed < Duration::from_secs(90));
    assert_errors_name_the_pooler(&storm);
}

/// Transaction pooling: refused by name, never two holders, nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_is_refused_by_name() {
    refused_under("transaction").await;
}

/// Statement pooling: the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_pooling_is_refused_by_name() {
    refused_under("statement").await;
}

/// Transaction pooling where the probe can miss: a pool of 6 server
/// sessions lent round robin (`server_round_robin = 1`), so a session's
/// probe may land on another server session than its claim; its lock
/// statements then run on whichever server session comes next. Whatever
/// refuses it (the probe, a missing prepared statement, or the guard on
/// each lock statement, `pooler.rs`): no two holders, no advisory lock
/// left, every error names the pooler. (With PgBouncer 1.18, which keeps
/// no prepared statement across server sessions, the sessions are refused
/// at connect; the guard alone is shown by
/// `the_guard_acts_only_on_the_claimed_server_session`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_round_robin_is_refused() {
    let server = PgServer::start();
    let pooler =
        PgBouncer::start_with_settings(&server, "transaction", 6, "server_round_robin = 1\n");
    fill_the_pool(&pooler, 6);
    // Rounds of storms: each client's sessions leave prepared statements
    // (named s0, s1, … in every client alike) on the server sessions they
    // ran on, so later rounds' statements find "their" prepared statement
    // on server sessions they never prepared it on.
    let started = Instant::now();
    let mut total = Storm::default();
    for _ in 0..6 {
        let round = storm(&pooler.url(), 2, 3, 20).await;
        total.grants += round.grants;
        total.refusals += round.refusals;
        total.overlaps += round.overlaps;
        total.errors.extend(round.errors);
    }
    total.elapsed = started.elapsed();
    let storm = total;
    let left = tokio::task::block_in_place(|| advisory_locks_left(&server));
    eprintln!(
        "PgBouncer pool_mode = transaction, default_pool_size = 6, server_round_robin = 1, \
         6 rounds x 2 clients x 3 tasks x 20 cycles: grants {}, refusals {}, overlaps {}, \
         advisory locks left {left}, elapsed {:?}",
        storm.grants, storm.refusals, storm.overlaps, storm.elapsed
    );
    for e in storm.errors.iter().take(3) {
        eprintln!("error: {e}");
    }
    assert_eq!(storm.overlaps, 0, "two holders at once: {storm:?}");
    assert_eq!(left, "0", "advisory locks left on the server");
    assert!(storm.refusals > 0, "the pooler was not refused: {storm:?}");
    assert!(
        storm.elapsed < Duration::from_secs(90),
        "took {:?}",
        storm.elapsed
    );
    assert_errors_name_the_pooler(&storm);
}

/// The guard every lock statement carries, through a real transaction
/// pooler (6 server sessions lent round robin): a server session claimed
/// with a token and holding a lock; the guarded try-lock with that token
/// grants there (sent in the claim's transaction), and sent again and
/// again through the pooler it grants only on the claimed server session;
/// the first time it lands on another one it fails naming the guard and
/// ends the claimed server session, so no advisory lock is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_acts_only_on_the_claimed_server_session() {
    let server = PgServer::start();
    let pooler =
        PgBouncer::start_with_settings(&server, "transaction", 6, "server_round_robin = 1\n");
    fill_the_pool(&pooler, 6);
    let guarded = format!(
        "SELECT pg_backend_pid(), pg_try_advisory_lock(43), $1 WHERE {}",
        dlock::backends::postgres::pooler_guard_sql(1)
    );
    // One transaction, so one server session: the claim, a lock, and the
    // guarded try-lock with the token just claimed (granted there).
    let claim = format!(
        "SELECT set_config('dlock.session', 'test.' || a.pid || '.' || \
         (EXTRACT(EPOCH FROM a.backend_start) * 1000000)::int8, false), pg_advisory_lock(42) \
         FROM pg_stat_activity a WHERE a.pid = pg_backend_pid(); \
         PREPARE gm(text) AS {guarded}; EXECUTE gm(current_setting('dlock.session'))"
    );
    let out = tokio::task::block_in_place(|| pooler.try_psql(&claim)).expect("claim");
    let last: Vec<&str> = out.lines().last().unwrap_or_default().split('|').collect();
    let [pid, granted, token] = last.as_slice() else {
        panic!("the claim answered {out:?}");
    };
    let (token, claimed_pid) = (
        token.to_string(),
        token.split('.').nth(1).unwrap().to_owned(),
    );
    assert_eq!(*pid, claimed_pid, "{out}");
    assert_eq!(
        *granted, "t",
        "the guarded try-lock on the claimed server session: {out}"
    );
    let (mut granted_on_claimed, mut refused) = (0, None);
    for i in 0..24 {
        let sql = format!("PREPARE g{i}(text) AS {guarded}; EXECUTE g{i}('{token}')");
        match tokio::task::block_in_place(|| pooler.try_psql(&sql)) {
            Ok(out) => {
                let pid = out.split('|').next().unwrap_or_default();
                assert_eq!(
                    pid, claimed_pid,
                    "the guarded statement acted elsewhere: {out}"
                );
                granted_on_claimed += 1;
            }
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let refused = refused.expect("round robin never left the claimed server session");
    eprintln!(
        "guard through PgBouncer (transaction, 6, round robin): granted in the claim's transaction, then {granted_on_claimed} run(s) on the \
         claimed server session, then: {refused}"
    );
    assert!(refused.contains("dlock-pooler-guard"), "{refused}");
    let left = tokio::task::block_in_place(|| advisory_locks_left(&server));
    assert_eq!(
        left, "0",
        "the claimed server session's locks were not freed"
    );
    let alive = tokio::task::block_in_place(|| {
        server.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {claimed_pid}"
        ))
    });
    assert_eq!(alive, "0", "the claimed server session was not ended");
}

/// Session pooling: exclusion and increasing fences through the pooler,
/// and the storm runs with no overlap and no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_excludes_and_fences() {
    let server = PgServer::start();
    let pooler = PgBouncer::start_with_pool(&server, "session", 40);
    let a = dlock::connect(&pooler.url()).await.unwrap();
    let b = dlock::connect(&pooler.url()).await.unwrap();
    let first = Lock::new("pooled")
        .with_backend(a.clone())
        .acquire()
        .await
        .unwrap();
    let refused = Lock::new("pooled")
        .with_backend(b.clone())
        .try_acquire()
        .await
        .unwrap();
    assert!(
        refused.is_none(),
        "a second holder through a session pooler"
    );
    let fence = first.fencing_token().unwrap();
    first.release().await.unwrap();
    let second = Lock::new("pooled")
        .with_backend(b.clone())
        .acquire()
        .await
        .unwrap();
    assert!(
        second.fencing_token().unwrap() > fence,
        "fences must increase"
    );
    second.release().await.unwrap();
    drop((a, b));

    let storm = storm(&pooler.url(), 2, 3, 15).await;
    eprintln!(
        "PgBouncer pool_mode = session: grants {}, refusals {}, overlaps {}, elapsed {:?}",
        storm.grants, storm.refusals, storm.overlaps, storm.elapsed
    );
    assert_eq!(storm.overlaps, 0);
    assert!(
        storm.errors.is_empty(),
        "errors under session pooling: {:?}",
        storm.errors
    );
    assert_eq!(storm.grants, 2 * 3 * 15);
}

/// A client process killed with SIGKILL while it holds a lock through a
/// session pooler: PgBouncer resets its server session (`DISCARD ALL`),
/// so the lock is free within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_behind_a_session_pooler_frees_its_lock() {
    let server = PgServer::start();
    let pooler = PgBouncer::start_with_pool(&server, "session", 40);
    let mut holder = Command::new(HOLDER)
        .args([&pooler.url(), "pooled-killed", "30000", "120000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start lock-holder");
    let stdout = holder.stdout.take().expect("piped stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        line
    });
    let line = tokio::time::timeout(Duration::from_secs(30), line)
        .await
        .expect("the holder acquired within 30 s")
        .unwrap();
    assert!(line.starts_with("ACQUIRED"), "holder said {line:?}");
    let backend = dlock::connect(&pooler.url()).await.unwrap();
    let held = Lock::new("pooled-killed")
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .unwrap();
    assert!(held.is_none(), "the holder's lock is not held");
    holder.kill().expect("kill -9 the holder");
    let killed = Instant::now();
    let _ = holder.wait();
    let guard = Lock::new("pooled-killed")
        .wait(Duration::from_secs(20))
        .with_backend(backend.clone())
        .acquire()
        .await
        .expect("the killed client's lock freed within 20 s");
    let freed = killed.elapsed();
    eprintln!("PgBouncer session mode: a kill -9'd holder's lock was free after {freed:?}");
    assert!(freed < Duration::from_secs(5), "freed after {freed:?}");
    guard.release().await.unwrap();
}

/// The cost of an uncontended acquire+release cycle on a direct
/// connection (every lock statement carries the pooler guard): printed,
/// not asserted. 100 warm-up cycles, then 3 × 300 measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_cycle_cost_is_printed() {
    let server = PgServer::start();
    let backend = dlock::connect(&server.url()).await.unwrap();
    let lock = Lock::new("cycle-cost").with_backend(backend.clone());
    for _ in 0..100 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let mut means = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        for _ in 0..300 {
            lock.acquire().await.unwrap().release().await.unwrap();
        }
        means.push(started.elapsed().as_secs_f64() * 1e6 / 300.0);
    }
    means.sort_by(f64::total_cmp);
    eprintln!(
        "direct acquire+release cycle: mean µs per cycle in 3 runs of 300: {:.0} / {:.0} / {:.0} (median {:.0})",
        means[0], means[1], means[2], means[1]
    );
}

/// Six `lock-holder` processes through a transaction pooler lending 6
/// server sessions round robin, 20 cycles each on one key. Processes run
/// the same code, so tokio-postgres names their prepared statements alike:
/// a statement can find "its" prepared statement on a server session
/// another process prepared it on, past the probe and past SQLSTATE 26000,
/// where only the guard refuses it. Whatever refuses each process: no two
/// holders (the marks file's `start`/`end` lines never interleave), no
/// advisory lock left, every error names the pooler, all within 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_through_a_round_robin_transaction_pooler_never_overlap() {
    let server = PgServer::start();
    let pooler =
        PgBouncer::start_with_settings(&server, "transaction", 6, "server_round_robin = 1\n");
    fill_the_pool(&pooler, 6);
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    let started = Instant::now();
    let mut children: Vec<std::process::Child> = (0..6)
        .map(|_| {
            Command::new(HOLDER)
                .args([&pooler.url(), "pooled-procs", "10000", "5", "20"])
                .arg(&marks)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start lock-holder")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut killed = 0;
    for child in &mut children {
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                killed += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let elapsed = started.elapsed();
    let mut errors = Vec::new();
    for child in &mut children {
        let mut text = String::new();
        if let Some(mut err) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
        }
        errors.extend(text.lines().map(str::to_owned).filter(|l| !l.is_empty()));
    }
    let lines = std::fs::read_to_string(&marks).unwrap_or_default();
    let (mut holder, mut grants, mut overlaps) = (None::<String>, 0, 0);
    for line in lines.lines() {
        let mut words = line.split(' ');
        let (what, pid) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        match what {
            "start" => {
                grants += 1;
                overlaps += usize::from(holder.is_some());
                holder = Some(pid.to_owned());
            }
            "end" if holder.as_deref() == Some(pid) => holder = None,
            _ => {}
        }
    }
    let left = tokio::task::block_in_place(|| advisory_locks_left(&server));
    eprintln!(
        "6 processes x 20 cycles through PgBouncer (transaction, 6, round robin): grants {grants}, \
         overlaps {overlaps}, errors {}, killed at 60 s {killed}, advisory locks left {left}, \
         elapsed {elapsed:?}",
        errors.len()
    );
    for e in errors.iter().take(4) {
        eprintln!("error: {e}");
    }
    assert_eq!(overlaps, 0, "two holders at once:\n{lines}");
    assert_eq!(killed, 0, "a process did not finish within 60 s");
    assert_eq!(left, "0", "advisory locks left on the server");
    for e in &errors {
        assert!(
            e.contains("pooler") && e.contains("pool_mode = session"),
            "an error that does not name the pooler: {e}"
        );
    }
}
