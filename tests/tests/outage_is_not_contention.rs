//! Issue 68: a wait that ended without an answer from the server is an
//! outage (`Backend`, 503 through `HttpError`), not contention (`Timeout`,
//! 409), however short the wait. An operator's soak saw 152 waits of 200 ms
//! end as `Timeout` during a Redis restart: their one request was still in
//! flight at the deadline, and waits under 250 ms were taken for "busy".
//!
//! On each backend (Redis: stopped, and killed then started again;
//! PostgreSQL, MariaDB, etcd, ZooKeeper: stopped with SIGSTOP, every
//! process of PostgreSQL), with one backend object kept throughout as an
//! application keeps it:
//! - **the counter-check**: 20 waits of 200 ms behind a real holder (another
//!   backend object) on the healthy server end as `Timeout`, 20 of 20;
//! - **the outage**: 20 waits of 200 ms on free keys while the server is
//!   stopped end as `Backend`, 20 of 20, each bounded (printed: the longest);
//!   the error shows no password;
//! - **one key, waits side by side**: `JOINED` waits of 200 ms on one key
//!   at once (`join_all`: only the first asks the server, the rest run out
//!   in this process's line), behind the holder: all `Timeout`; during the
//!   outage: all `Backend`;
//! - the server resumed (or started again), a lock is taken again.
//!
//! Each prints its counts; every wait is bounded by a timeout far above its
//! own, and the server is resumed before any assertion.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError};
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::mariadb::MariaDbServer;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::servers::redis::{RedisOptions, RedisServer};
use dlock_tests::servers::zookeeper::ZkServer;

/// Waits per phase.
const WAITS: usize = 20;

/// The wait of the soak: shorter than every former "silent" threshold
/// (250 ms on Redis, 1 s on etcd and ZooKeeper).
const WAIT: Duration = Duration::from_millis(200);

/// Waits side by side on one key.
const JOINED: usize = 5;

/// Far above any wait here: a wait still running after it is a hang.
const BOUND: Duration = Duration::from_secs(20);

const PASSWORD: &str = "s3cret-outage-pw";

/// How the waits of one phase ended.
#[derive(Default)]
struct Tally {
    backend: usize,
    timeout: usize,
    /// Anything else, as shown (a grant on a stopped server, another error).
    other: Vec<String>,
    longest: Duration,
    /// The first `Backend` error's text, for the report.
    sample: Option<String>,
}

impl Tally {
    fn show(&self) -> String {
        format!(
            "{} Backend, {} Timeout, {} other of {} (longest {:?}){}",
            self.backend,
            self.timeout,
            self.other.len(),
            self.backend + self.timeout + self.other.len(),
            self.longest,
            self.other
                .first()
                .map(|o| format!("; first other: {o}"))
                .unwrap_or_default()
        )
    }
}

/// `WAITS` waits of `WAIT`, one after the other, on the keys `key_of(i)`.
async fn waits(backend: &Arc<dyn LockBackend>, key_of: impl Fn(usize) -> String) -> Tally {
    let mut tally = Tally::default();
    for i in 0..WAITS {
        let started = Instant::now();
        let ended = one_wait(backend, key_of(i)).await;
        tally.longest = tally.longest.max(started.elapsed());
        tally.count(ended);
    }
    tally
}

/// `JOINED` waits of `WAIT` at once on `key`, in one task.
async fn joined_waits(backend: &Arc<dyn LockBackend>, key: &str) -> Tally {
    let mut tally = Tally::default();
    let started = Instant::now();
    let ended =
        futures_util::future::join_all((0..JOINED).map(|_| one_wait(backend, key.to_owned())))
            .await;
    tally.longest = started.elapsed();
    for one in ended {
        tally.count(one);
    }
    tally
}

type Ended = Result<Result<dlock::LockGuard, LockError>, tokio::time::error::Elapsed>;

/// One wait of `WAIT` on `key`, bounded by `BOUND`.
async fn one_wait(backend: &Arc<dyn LockBackend>, key: String) -> Ended {
    let lock = Lock::new(key)
        .with_backend(backend.clone())
        .ttl(Duration::from_secs(30))
        .wait(WAIT);
    tokio::time::timeout(BOUND, lock.acquire()).await
}

impl Tally {
    fn count(&mut self, ended: Ended) {
        let tally = self;
        match ended {
            Err(_) => tally.other.push(format!("no end within {BOUND:?}")),
            Ok(Ok(guard)) => {
                tally.other.push("granted".into());
                drop(guard);
            }
            Ok(Err(LockError::Timeout { .. })) => tally.timeout += 1,
            Ok(Err(e @ LockError::Backend { .. })) => {
                tally.backend += 1;
                tally.sample.get_or_insert_with(|| e.to_string());
            }
            Ok(Err(e)) => tally.other.push(format!("{e:?}")),
        }
    }
}

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    dlock::connect(url).await.expect("connect")
}

/// The two phases on `server`, `stop` and `start` being the outage's ends.
async fn outage_is_not_contention<S>(
    name: &str,
    server: &mut S,
    url: &str,
    stop: impl FnOnce(&mut S),
    start: impl FnOnce(&mut S),
) {
    let waiter = connect(url).await;
    let other = connect(url).await;
    let warm_up = Lock::new("warm-up")
        .with_backend(waiter.clone())
        .acquire()
        .await
        .expect("the warm-up lock");
    warm_up.release().await.expect("the warm-up release");

    // The counter-check: a real holder, a healthy server.
    let held = Lock::new("held")
        .with_backend(other.clone())
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .expect("the holder's lock");
    let contended = waits(&waiter, |_| "held".to_owned()).await;
    let contended_joined = joined_waits(&waiter, "held").await;
    held.release().await.expect("the holder's release");

    stop(server);
    let outage = waits(&waiter, |i| format!("free-{i}")).await;
    let outage_joined = joined_waits(&waiter, "free-joined").await;
    start(server);

    // Served again once the server is back (the same backend object).
    let again = tokio::time::timeout(
        BOUND,
        Lock::new("after")
            .with_backend(waiter.clone())
            .wait(Duration::from_secs(15))
            .acquire(),
    )
    .await;
    eprintln!("{name}: 200 ms waits behind a holder: {}", contended.show());
    eprintln!(
        "{name}: 200 ms waits on a stopped server: {}",
        outage.show()
    );
    eprintln!(
        "{name}: {JOINED} joined 200 ms waits on one key behind a holder: {}",
        contended_joined.show()
    );
    eprintln!(
        "{name}: {JOINED} joined 200 ms waits on one key on a stopped server: {}",
        outage_joined.show()
    );
    for sample in outage.sample.iter().chain(&outage_joined.sample) {
        eprintln!("{name}: the outage's error: {sample}");
        assert!(
            !sample.contains(PASSWORD),
            "{name}: the error shows the password: {sample}"
        );
    }
    assert_eq!(
        contended.timeout,
        WAITS,
        "{name}: behind a holder: {}",
        contended.show()
    );
    assert_eq!(
        outage.backend,
        WAITS,
        "{name}: on a stopped server: {}",
        outage.show()
    );
    assert_eq!(
        contended_joined.timeout,
        JOINED,
        "{name}: joined, behind a holder: {}",
        contended_joined.show()
    );
    assert_eq!(
        outage_joined.backend,
        JOINED,
        "{name}: joined, on a stopped server: {}",
        outage_joined.show()
    );
    match again {
        Ok(Ok(guard)) => guard.release().await.expect("the release after"),
        Ok(Err(e)) => panic!("{name}: no lock after the server came back: {e}"),
        Err(_) => panic!("{name}: no lock within {BOUND:?} after the server came back"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped() {
    let mut server = RedisServer::start_with(RedisOptions::new().password(PASSWORD));
    let url = server.url_with_credentials();
    outage_is_not_contention(
        "Redis (SIGSTOP)",
        &mut server,
        &url,
        |s| s.pause(),
        |s| s.resume(),
    )
    .await;
}

/// The operator's case: the server restarted (killed, so its port
/// refuses connections meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed() {
    let mut server = RedisServer::start_with(RedisOptions::new().password(PASSWORD));
    let url = server.url_with_credentials();
    outage_is_not_contention(
        "Redis (killed)",
        &mut server,
        &url,
        |s| s.kill9(),
        |s| s.start_again(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped() {
    let mut server = PgServer::start();
    let url = server.url();
    // Every process of the server: each session has its own.
    outage_is_not_contention(
        "PostgreSQL (SIGSTOP)",
        &mut server,
        &url,
        |s| s.try_pause_all().expect("pause PostgreSQL"),
        |s| s.try_resume_all().expect("resume PostgreSQL"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_stopped() {
    let mut server = MariaDbServer::start();
    let url = server.url();
    outage_is_not_contention(
        "MariaDB (SIGSTOP)",
        &mut server,
        &url,
        |s| s.pause(),
        |s| s.resume(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped() {
    let mut server = EtcdServer::start();
    let url = server.url();
    outage_is_not_contention(
        "etcd (SIGSTOP)",
        &mut server,
        &url,
        |s| s.pause(),
        |s| s.resume(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_stopped() {
    let mut server = ZkServer::start();
    let url = server.url();
    outage_is_not_contention(
        "ZooKeeper (SIGSTOP)",
        &mut server,
        &url,
        |s| s.pause(),
        |s| s.resume(),
    )
    .await;
}
