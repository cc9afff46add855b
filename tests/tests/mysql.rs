//! The MySQL backend against a real MariaDB: interop with SQL clients'
//! `GET_LOCK` on the same names (both ways), two leases of one process on
//! one key (`GET_LOCK` is re-entrant per session), long names hashed and
//! still inspected, fences across a restart, least-privilege accounts, and
//! bad input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::mysql::{lock_name, MysqlBackend};
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::acquisitions::wait_for;
use dlock_tests::fixtures::mysql::{sql_string, MysqlFixture};
use dlock_tests::poll::eventually_blocking as eventually;
use dlock_tests::servers::ServerControl;
use dlock_tests::sql_servers::{
    a_lease_held_through, a_sql_holder_is_waited_for, connected, SqlClientSession, SqlHolder,
};

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    connected(url, MysqlBackend::connect).await
}

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// A dlock waiter behind SQL code is served by the server's queue.
const SQL_CLIENT: SqlHolder = SqlHolder {
    who: "the SQL client",
    pause: Duration::from_millis(500),
    within: Duration::from_secs(1),
    how: "the server's queue",
};

/// A `mariadb` client process that runs `sql` and keeps its session open
/// until its stdin closes.
fn sql_session(fixture: &MysqlFixture, sql: &str) -> SqlClientSession {
    SqlClientSession::run(
        fixture.server().client_path(),
        [
            "--no-defaults".to_owned(),
            "-h127.0.0.1".to_owned(),
            "-uroot".to_owned(),
            "-N".to_owned(),
            "-B".to_owned(),
            format!("-P{}", fixture.server().port()),
            "dlock".to_owned(),
        ],
        sql,
    )
}

/// dlock and SQL's own `GET_LOCK` exclude each other on `lock_name(key)`,
/// both ways, and a dlock waiter is served by the server's queue when the
/// SQL session lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_get_lock_and_dlock_exclude_each_other() {
    let fixture = MysqlFixture::start();
    let backend = fixture.backend_for_tests().await;
    let name = sql_string(&lock_name(
        dlock_tests::servers::mariadb::DATABASE,
        "interop",
    ));
    let guard = lock(&backend, "interop").acquire().await.unwrap();
    assert_eq!(
        fixture.server().sql(&format!("SELECT GET_LOCK({name}, 0)")),
        "0"
    );
    guard.release().await.unwrap();
    assert_eq!(
        fixture.server().sql(&format!("SELECT GET_LOCK({name}, 0)")),
        "1"
    );

    let sql = sql_session(&fixture, &format!("SELECT GET_LOCK({name}, 0);"));
    eventually(
        "the SQL session holds the name",
        Duration::from_secs(10),
        || fixture.holder("interop").is_some(),
    )
    .await;
    a_sql_holder_is_waited_for(&backend, "interop", sql, &SQL_CLIENT).await;
}

/// A SQL client waiting in `GET_LOCK` behind dlock is served when dlock
/// releases, before a dlock waiter that asked later: one queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_waiters_and_dlock_waiters_share_the_servers_queue() {
    let fixture = MysqlFixture::start();
    let a = fixture.backend_for_tests().await;
    let b = fixture.backend_for_tests().await;
    let name = sql_string(&lock_name(dlock_tests::servers::mariadb::DATABASE, "queue"));
    let held = lock(&a, "queue").acquire().await.unwrap();
    let sql = sql_session(
        &fixture,
        &format!("SELECT GET_LOCK({name}, 30); SELECT SLEEP(1); SELECT RELEASE_LOCK({name});"),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiter = wait_for(lock(&b, "queue").wait(Duration::from_secs(20)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    // The SQL client (first in line) holds it for about a second.
    let (at, guard) = waiter.await.unwrap();
    let guard = guard.expect("the dlock waiter is served after the SQL client");
    assert!(
        at - released >= Duration::from_millis(700),
        "the later dlock waiter went before the SQL client: {:?}",
        at - released
    );
    guard.release().await.unwrap();
    sql.quit();
}

/// `GET_LOCK` is re-entrant per session: two leases of one process (and
/// one backend) on one key must never both be granted, whichever way they
/// are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leases_of_one_process_on_one_key_exclude_each_other() {
    let fixture = MysqlFixture::with_options("sessions=1");
    let backend = fixture.backend_for_tests().await;
    let first = lock(&backend, "twice")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    // Straight to the backend: no local queue or reentrancy in between.
    let req = dlock::backend::AcquireRequest {
        key: "twice".into(),
        token: format!("{}@test", "a".repeat(32)),
        ttl: Duration::from_secs(10),
    };
    assert!(
        backend.try_acquire(&req).await.unwrap().is_none(),
        "granted twice on one session"
    );
    let deadline = Instant::now() + Duration::from_millis(500);
    assert!(
        backend
            .acquire(&req, Some(deadline))
            .await
            .unwrap()
            .is_none(),
        "a wait was granted a held key"
    );
    // Another task of the same process, through the public API.
    let other = {
        let backend = backend.clone();
        tokio::spawn(async move { lock(&backend, "twice").try_acquire().await })
    };
    assert!(other.await.unwrap().unwrap().is_none());
    first.release().await.unwrap();
    let second = backend
        .try_acquire(&req)
        .await
        .unwrap()
        .expect("free after the release");
    assert!(backend.release(&second).await.unwrap());
    assert_eq!(fixture.holder("twice"), None);
}

/// A key too long for a name is hashed; `inspect` and `list` still show
/// the key, and SQL finds the hashed name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_keys_are_hashed_and_listed_by_their_key() {
    let fixture = MysqlFixture::start();
    let backend = fixture.backend_for_tests().await;
    let key = format!("long:{}", "k".repeat(400));
    let guard = lock(&backend, &key).acquire().await.unwrap();
    assert!(
        fixture.holder(&key).is_some(),
        "SQL sees the hashed name held"
    );
    let info = lock(&backend, &key).inspect().await.unwrap().expect("held");
    assert_eq!(info.fencing_token, guard.fencing_token());
    let listed = dlock::list_locks(backend.as_ref(), "long:").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, key);
    guard.release().await.unwrap();
    assert!(lock(&backend, &key).inspect().await.unwrap().is_none());
}

/// Fences keep increasing across a server restart (InnoDB keeps the
/// counter), and leases held through the restart are lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_a_server_restart() {
    let mut fixture = MysqlFixture::start();
    let backend = fixture.backend_for_tests().await;
    a_lease_held_through(
        &mut fixture,
        &backend,
        ("restart", None),
        (
            |f: &mut MysqlFixture| f.server_mut().restart(),
            Duration::from_secs(30),
            "the lease held through a restart is lost",
        ),
        (|_: &mut MysqlFixture| {}, "granted after the restart"),
    )
    .await;
}

/// An account with only the documented grants works; one without the
/// table and without CREATE is told what to grant at connect; one without
/// INSERT or UPDATE is refused each acquisition with the server's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_grants_work_and_missing_ones_are_named() {
    let fixture = MysqlFixture::start();
    let server = fixture.server();
    // No table yet, no CREATE: connect says what to do.
    server.sql("CREATE USER 'nothing'@'%' IDENTIFIED BY 'pw'; GRANT USAGE ON *.* TO 'nothing'@'%'");
    let err = MysqlBackend::connect(&server.url_as("nothing", "pw"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("CREATE") || text.contains("denied"), "{text}");
    assert!(!text.contains(":pw@"), "{text}");
    // The administrator makes the table (the first root client does) and
    // grants the four rights.
    drop(fixture.backend_for_tests().await);
    server.sql(
        "CREATE USER 'locker'@'%' IDENTIFIED BY 'pw'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON dlock.dlock_fences TO 'locker'@'%'",
    );
    let locker = connect(&server.url_as("locker", "pw")).await;
    let guard = lock(&locker, "grants").acquire().await.unwrap();
    assert!(guard.fencing_token().is_some());
    let info = lock(&locker, "grants")
        .inspect()
        .await
        .unwrap()
        .expect("held");
    assert_eq!(info.fencing_token, guard.fencing_token());
    assert!(lock(&locker, "grants").force_release().await.unwrap());
    tokio::time::timeout(Duration::from_secs(15), guard.lost())
        .await
        .expect("a forced release is seen by the holder");
    // Without UPDATE: the second acquisition of a name (an update of its
    // row) is refused with the server's message, and nothing stays held.
    server.sql("REVOKE UPDATE ON dlock.dlock_fences FROM 'locker'@'%'");
    // A new connect is refused, naming the privilege; the backend connected
    // before the REVOKE is refused at its acquisition.
    let refused = MysqlBackend::connect(&server.url_as("locker", "pw"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("UPDATE"), "{refused}");
    let limited = locker.clone();
    let err = lock(&limited, "grants")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("UPDATE"), "{err}");
    assert_eq!(
        fixture.holder("grants"),
        None,
        "a refused acquisition left the lock held"
    );
    // Without INSERT: a new name's acquisition is refused.
    server.sql("GRANT UPDATE ON dlock.dlock_fences TO 'locker'@'%'; REVOKE INSERT ON dlock.dlock_fences FROM 'locker'@'%'");
    let refused = MysqlBackend::connect(&server.url_as("locker", "pw"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("INSERT"), "{refused}");
    let err = lock(&limited, "fresh-name")
        .try_acquire()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("INSERT"), "{err}");
    assert_eq!(fixture.holder("fresh-name"), None);
}

/// A table dlock did not make (a view, a MEMORY table, a trigger on it) is
/// refused at connect, naming what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_is_not_dlocks_kind_is_refused() {
    let fixture = MysqlFixture::start();
    let server = fixture.server();
    server.sql("CREATE TABLE other (name VARBINARY(256) PRIMARY KEY); CREATE VIEW dlock_fences AS SELECT name FROM other");
    let err = MysqlBackend::connect(fixture.url()).await.unwrap_err();
    assert!(err.to_string().contains("VIEW"), "{err}");
    server.sql("DROP VIEW dlock_fences");
    drop(fixture.backend_for_tests().await);
    server
        .sql("CREATE TRIGGER sneaky BEFORE UPDATE ON dlock_fences FOR EACH ROW SET NEW.fence = 1");
    let err = MysqlBackend::connect(fixture.url()).await.unwrap_err();
    assert!(err.to_string().contains("trigger"), "{err}");
}

/// Bad input is a clear error, in time, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_error_in_time() {
    let fixture = MysqlFixture::start();
    let port = fixture.server().port();
    for (url, says) in [
        (
            format!("mysql://root@127.0.0.1:{port}/dlock?sesions=2"),
            "did you mean `sessions`?",
        ),
        (format!("mysql://root@127.0.0.1:{port}"), "no database"),
        (
            format!("mysql://root:wrong@127.0.0.1:{port}/dlock"),
            "Access denied",
        ),
        (
            format!("mysql://root@127.0.0.1:{port}/nosuchdb"),
            "nosuchdb",
        ),
    ] {
        let started = Instant::now();
        let err = MysqlBackend::connect(&url).await.unwrap_err();
        assert!(err.to_string().contains(says), "{url}: {err}");
        assert!(!err.to_string().contains("wrong"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    // Nothing listens: an error within the timeout.
    let port = dlock_tests::servers::ports::free_port().unwrap();
    let started = Instant::now();
    let err = MysqlBackend::connect(&format!("mysql://root@127.0.0.1:{port}/dlock?timeout=1s"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // Semaphores are offered; a read-write lock, a barrier and an election
    // are a typed "not supported" (`GET_LOCK` has no shared mode; no server
    // notification a watch could wait on: see the backends guide).
    let backend = fixture.backend_for_tests().await;
    let permit = dlock::Semaphore::new("s", 2)
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("a free permit");
    permit.release().await.unwrap();
    let err = dlock::RwLock::new("rw")
        .with_backend(backend.clone())
        .try_read()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("read-write"), "{err}");
    // A barrier too: `no_barriers`, naming the backends that have them.
    let err = dlock::Barrier::new("batch", 2)
        .with_backend(backend.clone())
        .enter()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("has no barriers"), "{err}");
    assert!(err.to_string().contains("zk"), "{err}");
    let election = dlock::Election::new("scheduler").with_backend(backend);
    let err = election.campaign("node-1").await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("no leader election"), "{err}");
    assert!(err.to_string().contains("postgres://"), "{err}");
    let err = election.leader().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
}
