//! A wait on a server that answers nothing ends as an outage, not contention.

use std::time::{Duration, Instant};

use dlock::Lock;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::servers::redis::RedisServer;
use dlock_tests::servers::zookeeper::ZkServer;

use super::connect;

/// A wait that ends while the server has not answered at all is an outage
/// (`Backend`, 503 through `HttpError`), not contention (`Timeout`, 409):
/// `Timeout` means a holder was seen (issue 54). The server is stopped
/// (SIGSTOP; on PostgreSQL every process of it) before a free key is asked
/// for with a 1 s wait, shorter than the request timeout.
async fn a_wait_on_a_silent_server_ends_as_an_outage<S>(
    name: &str,
    server: &mut S,
    url: &str,
    pause: impl FnOnce(&mut S),
    resume: impl FnOnce(&mut S),
) {
    let backend = connect(url).await;
    let warm_up = Lock::new("warm")
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    warm_up.release().await.unwrap();
    pause(server);
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let ended = tokio::time::timeout(
        wait + Duration::from_secs(10),
        Lock::new("silent")
            .with_backend(backend.clone())
            .wait(wait)
            .acquire(),
    )
    .await
    .unwrap_or_else(|_| panic!("{name}: the wait did not end"));
    let err = ended.expect_err("acquired a lock on a stopped server");
    eprintln!(
        "{name}: stopped server, 1 s wait: {err} after {:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, dlock::LockError::Backend { .. }),
        "{name}: a wait on a silent server ended as {err:?}, not as an outage"
    );
    short_waits_on_a_silent_server_end_as_outages(name, &backend).await;
    resume(server);
}

/// Issue 68's target: a 200 ms wait (an HTTP handler's) during an outage
/// ends as `Backend`, 20 of 20 (locks), and so do permit waits: however
/// short the wait, a request unanswered when it runs out is given the rest
/// of 250 ms, then the server is asked a read (`backend/silence.rs`).
async fn short_waits_on_a_silent_server_end_as_outages(
    name: &str,
    backend: &std::sync::Arc<dyn dlock::LockBackend>,
) {
    let wait = Duration::from_millis(200);
    let mut took = Vec::new();
    let mut timeouts = 0;
    for i in 0..25 {
        let started = Instant::now();
        let attempt = async {
            if i < 20 {
                Lock::new(format!("silent-short-{i}"))
                    .with_backend(backend.clone())
                    .wait(wait)
                    .acquire()
                    .await
                    .map(drop)
            } else {
                dlock::Semaphore::new(format!("silent-permits-{i}"), 2)
                    .with_backend(backend.clone())
                    .wait(wait)
                    .acquire()
                    .await
                    .map(drop)
            }
        };
        let ended = tokio::time::timeout(Duration::from_secs(10), attempt)
            .await
            .unwrap_or_else(|_| panic!("{name}: a 200 ms wait did not end"));
        took.push(started.elapsed());
        match ended {
            Err(dlock::LockError::Backend { .. }) => {}
            Err(dlock::LockError::Timeout { .. }) => timeouts += 1,
            other => panic!("{name}: a 200 ms wait on a silent server ended as {other:?}"),
        }
    }
    took.sort();
    eprintln!(
        "{name}: silent server, 200 ms waits: {} of 25 Backend (20 locks, 5 permits), ended after p50 {:?}, max {:?}",
        25 - timeouts,
        took[took.len() / 2],
        took[took.len() - 1]
    );
    assert_eq!(
        timeouts, 0,
        "{name}: {timeouts} of 25 short waits on a silent server ended as Timeout (contention), not Backend"
    );
}

/// The case on a server that one SIGSTOP silences (a single process).
async fn on_one_process<S: ServerControl>(name: &str, mut server: S, url: &str) {
    a_wait_on_a_silent_server_ends_as_an_outage(
        name,
        &mut server,
        url,
        |s| s.pause(),
        |s| s.resume(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_wait_on_a_silent_server_ends_as_an_outage() {
    let server = RedisServer::start();
    let url = server.url();
    on_one_process("Redis", server, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_wait_on_a_silent_server_ends_as_an_outage() {
    let mut server = PgServer::start();
    let url = server.url();
    // Every process of the server: each session has its own.
    a_wait_on_a_silent_server_ends_as_an_outage(
        "PostgreSQL",
        &mut server,
        &url,
        |s| s.try_pause_all().unwrap(),
        |s| s.try_resume_all().unwrap(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_wait_on_a_silent_server_ends_as_an_outage() {
    let server = EtcdServer::start();
    let url = server.url();
    on_one_process("etcd", server, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_a_wait_on_a_silent_server_ends_as_an_outage() {
    let server = ZkServer::start();
    let url = server.url();
    on_one_process("ZooKeeper", server, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_wait_on_a_silent_server_ends_as_an_outage() {
    let server = dlock_tests::servers::mariadb::MariaDbServer::start();
    let url = server.url();
    on_one_process("MariaDB", server, &url).await;
}
