//! A short wait on a stopped server ends within its wait, whatever it
//! waits for: a lock, a permit, a write lock. An HTTP handler with a
//! 200 ms wait must answer within about that, not after a connect or a
//! reconnect's own limit (a MariaDB permit wait once took 10 s here, a
//! Redis lock wait 1.1 s).
//!
//! Each backend object is warmed up first (a lock, a permit and a write
//! lock taken and released, so its pools and listeners are open), then the
//! server is stopped, and each wait is asked for in turn. The bound is the
//! wait plus [`SLACK`], generous for a loaded machine; the figures are
//! printed. What the error says (outage or contention) is
//! `outages.rs`'s subject, not this one's: here any error will do, as long
//! as it comes on time and no lock is granted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, RwLock, Semaphore};
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::mariadb::MariaDbServer;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::servers::redis::RedisServer;
use dlock_tests::servers::zookeeper::ZkServer;

use super::connect;

/// The wait every acquisition asks for: an HTTP handler's.
const SHORT_WAIT: Duration = Duration::from_millis(200);
/// How late past its wait an acquisition may end on a stopped server:
/// scheduling on a loaded 2-core machine, not a request's own limit.
const SLACK: Duration = Duration::from_millis(1500);

/// Warms `backend` up on every kind of wait it is asked for later
/// (read-write locks where it has them: MySQL has not).
async fn warm_up(name: &str, backend: &Arc<dyn LockBackend>, rw: bool) {
    let lock = Lock::new("stopped:warm")
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{name}: warm-up lock: {e}"));
    lock.release().await.unwrap();
    let permit = Semaphore::new("stopped:warm-permits", 2)
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{name}: warm-up permit: {e}"));
    permit.release().await.unwrap();
    if !rw {
        return;
    }
    let write = RwLock::new("stopped:warm-rw")
        .with_backend(backend.clone())
        .write()
        .await
        .unwrap_or_else(|e| panic!("{name}: warm-up write lock: {e}"));
    write.release().await.unwrap();
}

/// Runs `attempt` (an acquisition with [`SHORT_WAIT`]) and checks it ended
/// with an error within the wait plus [`SLACK`].
async fn ends_on_time<T, F>(name: &str, what: &str, attempt: F)
where
    F: std::future::Future<Output = Result<T, dlock::LockError>>,
{
    let started = Instant::now();
    let ended = tokio::time::timeout(SHORT_WAIT + Duration::from_secs(30), attempt)
        .await
        .unwrap_or_else(|_| panic!("{name}: {what} still waiting 30 s after its wait"));
    let took = started.elapsed();
    let err = match ended {
        Ok(_) => panic!("{name}: {what} granted on a stopped server"),
        Err(e) => e,
    };
    eprintln!("{name}: {what}, {SHORT_WAIT:?} wait, the server gone: {took:?}, {err}");
    assert!(
        took <= SHORT_WAIT + SLACK,
        "{name}: {what} with a {SHORT_WAIT:?} wait ended after {took:?} with the server gone ({err})"
    );
}

/// How the server goes away.
enum Gone<S> {
    /// Stopped: connections refused.
    Stopped,
    /// Frozen with SIGSTOP (every process of it: the first function),
    /// connections open and nothing answered, until the second lets it go
    /// on.
    Frozen(fn(&mut S), fn(&mut S)),
}

impl<S> Gone<S> {
    fn name(&self) -> &'static str {
        match self {
            Gone::Stopped => "stopped",
            Gone::Frozen(..) => "frozen",
        }
    }
}

/// A one-process server frozen and let go on.
fn frozen<S: ServerControl>() -> Gone<S> {
    Gone::Frozen(|s| s.pause(), |s| s.resume())
}

/// Takes `server` away (`gone`) under a warm backend and checks every kind
/// of wait, then lets a frozen server go on (so it stops cleanly).
async fn short_waits_end_on_time<S: ServerControl>(
    name: &str,
    server: &mut S,
    url: &str,
    rw: bool,
    gone: Gone<S>,
) {
    let backend = connect(url).await;
    warm_up(name, &backend, rw).await;
    let name = &format!("{name} ({})", gone.name());
    tokio::task::block_in_place(|| match gone {
        Gone::Stopped => server.stop(),
        Gone::Frozen(freeze, _) => freeze(server),
    });
    every_wait_ends_on_time(name, &backend, rw).await;
    if let Gone::Frozen(_, thaw) = gone {
        tokio::task::block_in_place(|| thaw(server));
    }
}

/// Each kind of wait, on a backend whose server has gone away.
async fn every_wait_ends_on_time(name: &str, backend: &Arc<dyn LockBackend>, rw: bool) {
    ends_on_time(
        name,
        "a lock",
        Lock::new("stopped:lock")
            .with_backend(backend.clone())
            .wait(SHORT_WAIT)
            .acquire(),
    )
    .await;
    ends_on_time(
        name,
        "a permit",
        Semaphore::new("stopped:permits", 2)
            .with_backend(backend.clone())
            .wait(SHORT_WAIT)
            .acquire(),
    )
    .await;
    if rw {
        ends_on_time(
            name,
            "a write lock",
            RwLock::new("stopped:rw")
                .with_backend(backend.clone())
                .wait(SHORT_WAIT)
                .write(),
        )
        .await;
    }
    // And again, now that the backend has seen the server gone.
    ends_on_time(
        name,
        "a second lock",
        Lock::new("stopped:lock-2")
            .with_backend(backend.clone())
            .wait(SHORT_WAIT)
            .acquire(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_short_waits_on_a_stopped_server_end_on_time() {
    let mut server = RedisServer::start();
    let url = server.url();
    short_waits_end_on_time("Redis", &mut server, &url, true, Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_short_waits_on_a_frozen_server_end_on_time() {
    let mut server = RedisServer::start();
    let url = server.url();
    short_waits_end_on_time("Redis", &mut server, &url, true, frozen()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_short_waits_on_a_stopped_server_end_on_time() {
    let mut server = PgServer::start();
    let url = server.url();
    short_waits_end_on_time("PostgreSQL", &mut server, &url, true, Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_short_waits_on_a_frozen_server_end_on_time() {
    let mut server = PgServer::start();
    let url = server.url();
    let gone = Gone::Frozen(
        |s: &mut PgServer| s.try_pause_all().unwrap(),
        |s: &mut PgServer| s.try_resume_all().unwrap(),
    );
    short_waits_end_on_time("PostgreSQL", &mut server, &url, true, gone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_short_waits_on_a_stopped_server_end_on_time() {
    let mut server = MariaDbServer::start();
    let url = server.url();
    short_waits_end_on_time("MariaDB", &mut server, &url, false, Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_short_waits_on_a_frozen_server_end_on_time() {
    let mut server = MariaDbServer::start();
    let url = server.url();
    short_waits_end_on_time("MariaDB", &mut server, &url, false, frozen()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_short_waits_on_a_stopped_server_end_on_time() {
    let mut server = EtcdServer::start();
    let url = server.url();
    short_waits_end_on_time("etcd", &mut server, &url, true, Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_short_waits_on_a_frozen_server_end_on_time() {
    let mut server = EtcdServer::start();
    let url = server.url();
    short_waits_end_on_time("etcd", &mut server, &url, true, frozen()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_short_waits_on_a_stopped_server_end_on_time() {
    let mut server = ZkServer::start();
    let url = server.url();
    short_waits_end_on_time("ZooKeeper", &mut server, &url, true, Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_short_waits_on_a_frozen_server_end_on_time() {
    let mut server = ZkServer::start();
    let url = server.url();
    short_waits_end_on_time("ZooKeeper", &mut server, &url, true, frozen()).await;
}
