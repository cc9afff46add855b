//! The MySQL backend on a shared server, against a real MariaDB: lock names
//! scoped to the URL's database by default (named locks are global to the
//! server), the privileges dlock needs checked at `connect`, a refused
//! grant naming its key, and a server whose `wait_timeout` is 10 s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::mysql::MysqlBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::acquisitions::wait_for;
use dlock_tests::fixtures::mysql::MysqlFixture;
use dlock_tests::sql_servers::connected;

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    connected(url, MysqlBackend::connect).await
}

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// The fixture's URL with database `database` instead of `dlock`.
fn url_of(fixture: &MysqlFixture, database: &str) -> String {
    let url = fixture.url();
    let (base, _) = url.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{database}")
}

/// Two applications on one server, databases `dlock` and `other`, default
/// URLs, the same key: both are granted at once. With one `?prefix=` given
/// to both, they share the lock on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_never_share_a_lock_by_default() {
    let fixture = MysqlFixture::start();
    fixture.server().sql("CREATE DATABASE other");
    let a = connect(fixture.url()).await;
    let b = connect(&url_of(&fixture, "other")).await;
    let first = lock(&a, "report").try_acquire().await.unwrap();
    let second = lock(&b, "report").try_acquire().await.unwrap();
    assert!(first.is_some(), "database dlock refused");
    assert!(
        second.is_some(),
        "database other refused: the lock was shared"
    );
    let shared_a = connect(&format!("{}?prefix=shared", fixture.url())).await;
    let shared_b = connect(&format!("{}?prefix=shared", url_of(&fixture, "other"))).await;
    let held = lock(&shared_a, "report").try_acquire().await.unwrap();
    assert!(held.is_some());
    assert!(
        lock(&shared_b, "report")
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "an explicit ?prefix= shared across databases is one lock"
    );
}

/// An account that may read but not write dlock's table: `connect` fails,
/// naming the privilege, the account and the GRANT to run. A grant refused
/// later (a privilege revoked after connect) names the lock's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_privileges_are_named_at_connect() {
    let fixture = MysqlFixture::start();
    // The table exists (an administrator's connect made it).
    drop(connect(fixture.url()).await);
    let server = fixture.server();
    server.sql("CREATE USER 'reader'@'%' IDENTIFIED BY 'pw'");
    server.sql("GRANT SELECT ON dlock.* TO 'reader'@'%'");
    let refused = MysqlBackend::connect(&server.url_as("reader", "pw"))
        .await
        .expect_err("connect passed without INSERT");
    let text = refused.to_string();
    eprintln!("connect without INSERT: {text}");
    assert!(text.contains("INSERT"), "{text}");
    assert!(text.contains("'reader'@'%'"), "{text}");
    assert!(
        text.contains("GRANT SELECT, INSERT, UPDATE, DELETE ON"),
        "{text}"
    );

    server.sql("CREATE USER 'writer'@'%' IDENTIFIED BY 'pw'");
    server.sql("GRANT SELECT, INSERT, UPDATE, DELETE ON dlock.dlock_fences TO 'writer'@'%'");
    let writer = connect(&server.url_as("writer", "pw")).await;
    server.sql("REVOKE INSERT, UPDATE ON dlock.dlock_fences FROM 'writer'@'%'");
    let refused = lock(&writer, "billing-run")
        .try_acquire()
        .await
        .expect_err("a grant without INSERT or UPDATE");
    let text = refused.to_string();
    eprintln!("an acquisition refused by the server: {text}");
    assert!(text.contains("billing-run"), "{text}");
}

/// A server whose `wait_timeout` is 10 s (a DBA's or a managed service's
/// setting): dlock's sessions set their own (`?session_timeout=`, 30 s) and
/// speak every third of it, so a holder keeps its lock 20 s, a waiter
/// behind it 20 s is granted, and a backend idle 20 s acquires again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_server_wait_timeout_is_survived() {
    let fixture = MysqlFixture::start();
    fixture.server().sql("SET GLOBAL wait_timeout = 10");
    let holder = connect(fixture.url()).await;
    let waiter_backend = connect(fixture.url()).await;
    let guard = lock(&holder, "slow")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let waiter = wait_for(lock(&waiter_backend, "slow").wait(Duration::from_secs(40)));
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(guard.is_held(), "the holder lost its lock after 20 s");
    guard.ensure().expect("held after 20 s");
    guard.release().await.unwrap();
    let (at, next) = waiter.await.unwrap();
    let next = next.expect("the waiter, 20 s in the queue, is granted");
    eprintln!(
        "wait_timeout=10: the waiter was granted after {:?}",
        at - started
    );
    next.release().await.unwrap();
    // Idle for twice the server's wait_timeout: the next use is quiet.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let again = lock(&holder, "slow")
        .try_acquire()
        .await
        .expect("an idle backend acquires again")
        .expect("free");
    again.release().await.unwrap();
}
