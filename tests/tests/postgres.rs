//! The PostgreSQL backend against a real server: interop with SQL clients
//! (psql) on the same advisory keys, a terminated session, a frozen
//! holder process, bounded sessions, and bad input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::postgres::{advisory_key, rw_advisory_key, PostgresBackend};
use dlock::{Lock, LockBackend, LockError, RwLock, Semaphore};
use dlock_tests::acquisitions::acquire_and_release;
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::postgres::{pg_rw_locks_of, PgFixture};
use dlock_tests::poll::eventually_blocking as eventually;
use dlock_tests::servers::ports::free_port;
use dlock_tests::sql_servers::{
    a_frozen_holder_is_freed_by_the_server as frozen_holder_case, a_sql_holder_is_waited_for,
    an_ended_session_loses_exactly_its_leases, connected, SqlClientSession, SqlHolder,
};

const HOLDER: &str = env!("CARGO_BIN_EXE_lock-holder");

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    connected(url, PostgresBackend::connect).await
}

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// A dlock waiter behind psql is served by its re-check.
const PSQL: SqlHolder = SqlHolder {
    who: "psql",
    pause: Duration::from_millis(300),
    within: Duration::from_secs(3),
    how: "re-check net",
};

/// A psql process that takes `pg_advisory_lock(id)` and keeps its session
/// open until its stdin closes.
fn psql_holder(fixture: &PgFixture, id: i64) -> SqlClientSession {
    psql_session(fixture, &format!("SELECT pg_advisory_lock({id});"))
}

/// A psql session that runs `sql` and stays open until its stdin closes.
fn psql_session(fixture: &PgFixture, sql: &str) -> SqlClientSession {
    SqlClientSession::run(
        fixture.server().psql_path(),
        fixture.server().psql_args(),
        sql,
    )
}

/// dlock and SQL code exclude each other on `advisory_key`, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_and_dlock_exclude_each_other() {
    let fixture = PgFixture::start();
    let backend = fixture.backend_for_tests().await;
    let id = advisory_key("interop");
    // dlock holds: psql's try is refused; after the release it is granted.
    let guard = lock(&backend, "interop").acquire().await.unwrap();
    assert_eq!(
        fixture
            .server()
            .psql(&format!("SELECT pg_try_advisory_lock({id})")),
        "f"
    );
    guard.release().await.unwrap();
    assert_eq!(
        fixture
            .server()
            .psql(&format!("SELECT pg_try_advisory_lock({id})")),
        "t"
    );
    // psql holds: dlock is busy, and is granted once psql's session ends
    // (a foreign unlock announces nothing: the waiter's re-check finds it).
    let psql = psql_holder(&fixture, id);
    eventually("psql holds the key", Duration::from_secs(10), || {
        !fixture.holders("interop").is_empty()
    })
    .await;
    a_sql_holder_is_waited_for(&backend, "interop", psql, &PSQL).await;
}

/// A read-write lock is a pair of two-`int4` advisory locks, apart from the
/// plain lock of the same key; SQL code reads beside dlock's readers with
/// `pg_try_advisory_lock_shared(k1, k2)` and is kept out by its writers; a
/// writer cancelled while it waits leaves nothing on its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_locks_are_shared_advisory_locks_apart_from_plain_ones() {
    let fixture = PgFixture::start();
    let backend = fixture.backend_for_tests().await;
    let rw = |key: &str| RwLock::new(key).with_backend(backend.clone());
    let rw_held = |key: &str| {
        fixture.server().psql(&format!(
            "SELECT count(*) FROM pg_locks WHERE {}",
            pg_rw_locks_of(key)
        ))
    };
    // The plain lock and the read-write lock of one key are separate.
    let plain = lock(&backend, "both").acquire().await.unwrap();
    let writer = rw("both").try_write().await.unwrap();
    let writer = writer.expect("a plain lock kept a read-write lock's writer out");
    assert!(
        lock(&backend, "both")
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "the plain lock is still held"
    );
    // A writer keeps SQL's readers out.
    let (k1, k2) = rw_advisory_key("both");
    // psql computes the same two numbers (the formula in dlock::guide::backends).
    let hex = "encode(sha256(convert_to('dlock:both', 'UTF8')), 'hex')";
    assert_eq!(
        fixture.server().psql(&format!(
            "SELECT ('x' || substr({hex}, 17, 8))::bit(32)::int4, ('x' || substr({hex}, 25, 8))::bit(32)::int4"
        )),
        format!("{k1}|{k2}")
    );
    let shared = format!("SELECT pg_try_advisory_lock_shared({k1}, {k2})");
    assert_eq!(fixture.server().psql(&shared), "f");
    writer.release().await.unwrap();
    plain.release().await.unwrap();
    // A reader lets SQL read beside it and keeps SQL's writers out.
    let reader = rw("both").read().await.unwrap();
    assert_eq!(fixture.server().psql(&shared), "t");
    assert_eq!(
        fixture
            .server()
            .psql(&format!("SELECT pg_try_advisory_lock({k1}, {k2})")),
        "f"
    );
    // A writer cancelled while it waits (its intent key held) leaves only
    // the reader's lock behind, and a reader gets in at once.
    let cancelled = tokio::time::timeout(Duration::from_millis(300), rw("both").write()).await;
    assert!(cancelled.is_err(), "a writer got in beside a reader");
    eventually(
        "the cancelled writer's keys are let go",
        Duration::from_secs(5),
        || {
            fixture
                .server()
                .psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2")
                == "1"
        },
    )
    .await;
    let second = rw("both").try_read().await.unwrap();
    second
        .expect("a cancelled writer kept a reader out")
        .release()
        .await
        .unwrap();
    assert_eq!(rw_held("both"), "1");
    reader.release().await.unwrap();
    assert_eq!(rw_held("both"), "0");
}

/// A semaphore's limit is the server's: each permit is one slot advisory
/// lock plus a shared count marker, visible in `pg_locks`; another count
/// is refused while a permit is out, and a cancelled waiter leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_permits_are_advisory_locks_on_the_server() {
    let fixture = PgFixture::start();
    let (a, b) = (
        fixture.backend_for_tests().await,
        fixture.backend_for_tests().await,
    );
    let advisory = || {
        fixture.server().psql(
            "SELECT count(*) FILTER (WHERE objsubid = 1) || '/' || count(*) FILTER (WHERE objsubid = 2) \
             FROM pg_locks WHERE locktype = 'advisory' AND granted",
        )
    };
    let sem = |backend: &Arc<dyn LockBackend>, n: usize| {
        Semaphore::new("pool", n).with_backend(backend.clone())
    };
    let first = sem(&a, 2).acquire().await.unwrap();
    let second = sem(&b, 2).acquire().await.unwrap();
    // Two slots, two count markers.
    assert_eq!(advisory(), "2/2");
    assert!(
        sem(&b, 2).try_acquire().await.unwrap().is_none(),
        "a third permit of 2"
    );
    let err = sem(&b, 3).try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains('2') && text.contains('3'), "{text}");
    // A waiter cancelled by its caller leaves nothing behind.
    let cancelled = tokio::time::timeout(Duration::from_millis(300), sem(&a, 2).acquire()).await;
    assert!(cancelled.is_err(), "a third permit of 2");
    eventually(
        "the cancelled waiter left nothing",
        Duration::from_secs(5),
        || advisory() == "2/2",
    )
    .await;
    first.release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(advisory(), "0/0");
    // Every permit back: another count is welcome.
    let three = sem(&a, 3).try_acquire().await.unwrap();
    three
        .expect("a new count once every permit is back")
        .release()
        .await
        .unwrap();
}

/// `pg_terminate_backend` on the holder's session: its guard reports lost
/// (only the leases of that session), another client is granted the key,
/// and its fencing token is greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_loses_exactly_its_leases() {
    let fixture = PgFixture::with_options("sessions=2");
    let a = connect(fixture.url()).await;
    let b = connect(fixture.url()).await;
    an_ended_session_loses_exactly_its_leases(
        a,
        b,
        |key| {
            let pids = fixture.holders(key);
            assert!(pids.len() <= 1, "one session holds {key}: {pids:?}");
            pids.first().copied()
        },
        |pid| {
            fixture
                .server()
                .psql(&format!("SELECT pg_terminate_backend({pid})"));
        },
        "terminated",
    )
    .await;
}

/// The server frees a terminated session's locks at once, so its leases
/// are reported lost at once too (the session's end wakes the watchdog),
/// not at their next renewal a third of the ttl later: with a 30 s ttl,
/// the loss is seen long before the 10 s renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_is_reported_lost_at_once() {
    let fixture = PgFixture::start();
    let backend = connect(fixture.url()).await;
    let ttl = Duration::from_secs(30);
    let guard = lock(&backend, "at-once").ttl(ttl).acquire().await.unwrap();
    let lost = guard.lost();
    let pid = fixture.holders("at-once");
    assert_eq!(pid.len(), 1);
    let terminated = Instant::now();
    fixture
        .server()
        .psql(&format!("SELECT pg_terminate_backend({})", pid[0]));
    tokio::time::timeout(ttl / 3 - Duration::from_secs(5), lost)
        .await
        .expect("lost() long before the next renewal");
    eprintln!(
        "terminated session's lease reported lost after {:?}",
        terminated.elapsed()
    );
    assert!(!guard.is_held());
}

/// A holder process frozen with SIGSTOP: the server ends its silent
/// session after `session_timeout`, another client is granted the key, and
/// the resumed holder finds its lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_is_freed_by_the_server() {
    let fixture = PgFixture::start();
    frozen_holder_case(HOLDER, fixture.url(), connect(fixture.url()).await).await;
}

/// A renewal statement names at most 1,000 leases (and 128 KiB of names):
/// 2,500 locks on one session renew in three statements and all stay held
/// through three ttls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_locks_than_one_renewal_statement_takes_stay_held() {
    const HELD: usize = 2_500;
    let fixture = PgFixture::with_options("sessions=1");
    let backend = fixture.backend_for_tests().await;
    let ttl = Duration::from_secs(2);
    let mut guards = Vec::with_capacity(HELD);
    for chunk in (0..HELD).collect::<Vec<_>>().chunks(250) {
        let taken = futures_util::future::join_all(chunk.iter().map(|i| {
            let lock = lock(&backend, &format!("statements:{i}")).ttl(ttl);
            async move { lock.acquire().await.unwrap() }
        }))
        .await;
        guards.extend(taken);
    }
    tokio::time::sleep(ttl * 3).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of {HELD} leases lost");
    let held = fixture.server().psql(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1",
    );
    assert_eq!(held, HELD.to_string());
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Holding many locks at once opens no more than `?sessions=` connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_share_a_few_sessions() {
    let fixture = PgFixture::with_options("sessions=3");
    let backend = fixture.backend_for_tests().await;
    let mut guards = Vec::new();
    for i in 0..300 {
        guards.push(
            lock(&backend, &format!("many:{i}"))
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Every client connection but psql's own: the 3 lock sessions (no
    // acquisition waited: no waiting session, no listener).
    let connections = fixture.server().psql(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    );
    assert_eq!(
        connections,
        "3",
        "300 locks on 3 sessions: {}",
        fixture
            .server()
            .psql("SELECT pid, count(*) FROM pg_locks WHERE locktype = 'advisory' GROUP BY pid")
    );
    let held = fixture.server().psql(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1",
    );
    assert_eq!(held, "300");
    assert_eq!(
        dlock::list_locks(&*backend, "many:").await.unwrap().len(),
        300
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    let held = fixture.server().psql(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1",
    );
    assert_eq!(held, "0");
}

/// Each bad input is a clear error within the connect timeout, and no
/// error shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_error_in_time() {
    let fixture = PgFixture::start();
    let server = fixture.server();
    server.psql("CREATE ROLE app LOGIN PASSWORD 'right-pw'");
    server.psql("GRANT CREATE ON SCHEMA public TO app");
    let hba = server.dir().join("data").join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all app 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    server.psql("SELECT pg_reload_conf()");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let port = server.port();
    let down = free_port().unwrap();
    let limit = Duration::from_secs(2);
    for (url, expect) in [
        (
            format!("postgres://app:wrong-pw@127.0.0.1:{port}/postgres?connect_timeout=2"),
            "password authentication failed",
        ),
        (
            format!("postgres://postgres:wrong-pw@127.0.0.1:{port}/nope?connect_timeout=2"),
            "database \"nope\" does not exist",
        ),
        (
            format!("postgres://app:wrong-pw@127.0.0.1:{down}/postgres?connect_timeout=2"),
            "error connecting to server",
        ),
        (
            format!("postgres://app:wrong-pw@127.0.0.1:{port}/postgres?sslmode=require&connect_timeout=2"),
            "server does not support TLS",
        ),
        (
            format!("postgres://app:wrong-pw@127.0.0.1:{port}/postgres?sesions=2"),
            "did you mean `sessions`",
        ),
    ] {
        let started = Instant::now();
        let err = dlock::connect(&url).await.unwrap_err().to_string();
        let took = started.elapsed();
        assert!(err.contains(expect), "{url}: {err}");
        assert!(!err.contains("wrong-pw"), "the password leaked: {err}");
        assert!(took <= limit + Duration::from_secs(1), "{url}: {took:?}");
    }
    // The right password works.
    let ok = connect(&format!(
        "postgres://app:right-pw@127.0.0.1:{port}/postgres"
    ))
    .await;
    assert!(!ok.describe().contains("right-pw"), "{}", ok.describe());
}

/// A read-only standby is refused at connect, within the connect timeout:
/// its advisory locks would exclude nobody on the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_refused() {
    let mut fixture = PgFixture::start();
    tokio::task::block_in_place(|| fixture.server_mut().restart_as_standby());
    assert_eq!(fixture.server().psql("SELECT pg_is_in_recovery()"), "t");
    let started = Instant::now();
    let err = dlock::connect(&format!("{}?connect_timeout=2", fixture.url()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::InvalidOption { .. })
            && err.to_string().contains("read-only standby"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// A role that may not create the fence table gets an error that says so
/// and what to run; with a schema it may create in, it works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_not_create_the_table_is_told_what_to_do() {
    let fixture = PgFixture::start();
    let server = fixture.server();
    server.psql("CREATE ROLE weak LOGIN");
    let port = server.port();
    let err = dlock::connect(&format!("postgres://weak@127.0.0.1:{port}/postgres"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("may not create them"), "{err}");
    assert!(err.contains("?schema="), "{err}");
    server.psql("CREATE SCHEMA locks AUTHORIZATION weak");
    let backend = connect(&format!(
        "postgres://weak@127.0.0.1:{port}/postgres?schema=locks"
    ))
    .await;
    let guard = lock(&backend, "weak").acquire().await.unwrap();
    assert!(guard.fencing_token().is_some_and(|t| t > 1));
    guard.release().await.unwrap();
}

/// Fencing tokens keep increasing across a server restart (the counter row
/// is durable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_a_server_restart() {
    let mut fixture = PgFixture::start();
    let backend = connect(fixture.url()).await;
    let first = lock(&backend, "restart").acquire().await.unwrap();
    let before = first.fencing_token().unwrap();
    let lost = first.lost();
    tokio::task::block_in_place(|| fixture.server_mut().fast_restart());
    tokio::time::timeout(Duration::from_secs(40), lost)
        .await
        .expect("the restart ends the holder's session: lost");
    let after = connect(fixture.url()).await;
    let second = lock(&after, "restart").acquire().await.unwrap();
    assert!(second.fencing_token().unwrap() > before);
    second.release().await.unwrap();
}

/// An election is the advisory lock of its name: SQL code holding that
/// number keeps every candidate out, and reads the leader from
/// `dlock_leaders`. A leader whose session is ended stops being shown at
/// once, before anyone else is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_are_advisory_locks_sql_can_see() {
    let fixture = PgFixture::start();
    let backend = fixture.backend_for_tests().await;
    let election = dlock::Election::new("scheduler").with_backend(backend.clone());
    // psql holds the election's number: nobody is elected, nobody leads.
    let psql = psql_holder(&fixture, advisory_key("scheduler"));
    eventually("psql holds the key", Duration::from_secs(10), || {
        !fixture.holders("scheduler").is_empty()
    })
    .await;
    let refused = election
        .clone()
        .wait(Duration::ZERO)
        .campaign("node-a")
        .await
        .unwrap_err();
    assert!(matches!(refused, LockError::Busy { .. }), "{refused:?}");
    assert_eq!(election.leader().await.unwrap(), None);
    psql.quit();
    let leadership = election
        .clone()
        .wait(Duration::from_secs(10))
        .campaign("node-a")
        .await
        .unwrap();
    // SQL reads who leads, and the term is the key's fence.
    let row = fixture
        .server()
        .psql("SELECT value || ' ' || term FROM dlock_leaders WHERE name = 'dlock:scheduler'");
    assert_eq!(row, format!("node-a {}", leadership.term()));
    let fence = fixture
        .server()
        .psql("SELECT counter FROM dlock_fences WHERE name = 'dlock:scheduler'");
    assert_eq!(fence, leadership.term().to_string());
    // The leader's session ended: the record no longer counts, at once.
    let other = connect(fixture.url()).await;
    let watcher = dlock::Election::new("scheduler").with_backend(other.clone());
    assert_eq!(
        watcher.leader().await.unwrap().map(|l| l.value),
        Some("node-a".to_owned())
    );
    let lost = leadership.lost();
    fixture.steal("scheduler").await;
    assert_eq!(
        watcher.leader().await.unwrap(),
        None,
        "a dead session leads"
    );
    tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("the leader learns its session ended");
    assert!(!leadership.is_leader());
    let next = watcher
        .clone()
        .wait(Duration::from_secs(10))
        .campaign("node-b")
        .await
        .unwrap();
    assert!(next.term() > leadership.term());
    next.resign().await.unwrap();
}

/// A role granted only the lock tables (no CREATE) is told how to make the
/// leaders' table on its first election; with it made and granted, the
/// role's elections work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_need_their_table_and_say_how_to_grant_it() {
    let fixture = PgFixture::start();
    let server = fixture.server();
    let port = server.port();
    server.psql("CREATE SCHEMA locks");
    // The owner makes the lock tables (dlock as superuser, in that schema).
    let owner = connect(&format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?schema=locks"
    ))
    .await;
    drop(owner);
    server.psql(
        "CREATE ROLE weak LOGIN; GRANT USAGE ON SCHEMA locks TO weak; \
         GRANT SELECT, INSERT, UPDATE ON locks.dlock_fences, locks.dlock_holders TO weak",
    );
    let weak = connect(&format!(
        "postgres://weak@127.0.0.1:{port}/postgres?schema=locks"
    ))
    .await;
    acquire_and_release(&lock(&weak, "plain")).await;
    let election = dlock::Election::new("compactor").with_backend(weak.clone());
    let err = election.campaign("node-a").await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("dlock_leaders"), "{text}");
    assert!(text.contains("may not create it"), "{text}");
    assert!(
        text.contains("GRANT SELECT, INSERT, UPDATE, DELETE"),
        "{text}"
    );
    server.psql(
        "CREATE UNLOGGED TABLE locks.dlock_leaders (name text PRIMARY KEY, holder text NOT NULL, \
         pid int4 NOT NULL, term bigint NOT NULL, value text NOT NULL); \
         GRANT SELECT, INSERT, UPDATE, DELETE ON locks.dlock_leaders TO weak",
    );
    let leadership = election.campaign("node-a").await.unwrap();
    assert_eq!(
        election.leader().await.unwrap().map(|l| l.value),
        Some("node-a".to_owned())
    );
    leadership.resign().await.unwrap();
    assert_eq!(election.leader().await.unwrap(), None);
}

/// Processes started together on a fresh schema all create dlock's tables
/// at once: PostgreSQL lets two `CREATE TABLE IF NOT EXISTS` both pass
/// their check, and the later one fails with "type … already exists" (the
/// CI run of `925d34d` lost an election candidate to it). To line the
/// clients up, a psql session drops the schema in an open transaction: each
/// client finds no table and its `CREATE` waits on the schema's lock; the
/// transaction is rolled back and they all create at once. Every client
/// must connect, lock and campaign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_creating_the_tables_at_once_all_start() {
    let fixture = PgFixture::start();
    let server = fixture.server();
    let port = server.port();
    const ROUNDS: usize = 8;
    const CLIENTS: usize = 16;
    for round in 0..ROUNDS {
        let schema = format!("race_{round}");
        server.psql(&format!("CREATE SCHEMA {schema}"));
        let mut dropping = psql_session(&fixture, &format!("BEGIN; DROP SCHEMA {schema};"));
        eventually("psql drops the schema", Duration::from_secs(20), || {
            server.psql(
                "SELECT count(*) FROM pg_locks WHERE granted AND locktype = 'object' \
                 AND mode = 'AccessExclusiveLock' AND classid = 'pg_namespace'::regclass",
            ) == "1"
        })
        .await;
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres?schema={schema}");
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let url = url.clone();
                tokio::spawn(async move {
                    let failed = |what: &str, e: LockError| format!("client {i}: {what}: {e}");
                    let backend = PostgresBackend::connect(&url)
                        .await
                        .map_err(|e| failed("connect", e))?;
                    let backend: Arc<dyn LockBackend> = Arc::new(backend);
                    let guard = lock(&backend, &format!("k{i}"))
                        .acquire()
                        .await
                        .map_err(|e| failed("acquire", e))?;
                    guard.release().await.map_err(|e| failed("release", e))?;
                    let leadership = dlock::Election::new(format!("e{i}"))
                        .with_backend(backend)
                        .campaign("node")
                        .await
                        .map_err(|e| failed("campaign", e))?;
                    leadership.resign().await.map_err(|e| failed("resign", e))
                })
            })
            .collect();
        let waiting = || {
            server.psql("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'object'")
        };
        eventually(
            "every client waits to create",
            Duration::from_secs(20),
            || waiting() == CLIENTS.to_string(),
        )
        .await;
        dropping.send("ROLLBACK;");
        for client in clients {
            client
                .await
                .expect("client task")
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        dropping.quit();
    }
}
