//! The MySQL backend's faults against a real MariaDB: a holder process
//! killed with SIGKILL, a holder process frozen, a session killed by an
//! operator (`KILL`), the server stopped (SIGSTOP) and resumed, and
//! restarted, a network that forgets the flows (a fault proxy), and
//! acquisitions dropped at every await. In each: `lost()` fires within the
//! lease's ttl, no two holders overlap, and the next holder is served
//! within a second or two.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::mysql::MysqlBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::acquisitions::wait_for;
use dlock_tests::fixtures::mysql::MysqlFixture;
use dlock_tests::holder::{check_marks, Holder, HolderSpec};
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::ServerControl;
use dlock_tests::sql_servers::{
    a_frozen_holder_is_freed_by_the_server as frozen_holder_case, a_lease_held_through,
    an_ended_session_loses_exactly_its_leases, connected,
};

const HOLDER: &str = env!("CARGO_BIN_EXE_lock-holder");

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    connected(url, MysqlBackend::connect).await
}

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// A holder process killed with SIGKILL: its connection closes, the server
/// frees its lock at once, and a waiter of another process is served
/// within a second; two holder processes cycling meanwhile never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_its_lock_at_once() {
    let fixture = MysqlFixture::start();
    let mut holder = Holder::spawn(
        HOLDER,
        &HolderSpec::once(
            fixture.url(),
            "crash",
            Duration::from_secs(30),
            Duration::from_secs(60),
        ),
    );
    let first: u64 = holder
        .acquired(Duration::from_secs(20))
        .await
        .parse()
        .unwrap();
    let backend = fixture.backend_for_tests().await;
    let waiter = wait_for(lock(&backend, "crash").wait(Duration::from_secs(20)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    holder.kill9().await;
    let (at, guard) = waiter.await.unwrap();
    let guard = guard.expect("served after the holder was killed");
    let after = at - killed;
    eprintln!("a killed holder's lock granted to a waiter {after:?} after SIGKILL");
    assert!(after < Duration::from_secs(2), "{after:?}");
    assert!(guard.fencing_token().unwrap() > first);
    guard.release().await.unwrap();

    // Two processes take turns; the marks never interleave.
    let marks = tempfile::NamedTempFile::new().unwrap();
    let spec = HolderSpec {
        url: fixture.url().to_owned(),
        key: "turns".into(),
        ttl: Duration::from_secs(5),
        hold: Duration::from_millis(20),
        cycles: 15,
        marks: Some(marks.path().to_path_buf()),
    };
    let mut a = Holder::spawn(HOLDER, &spec);
    let mut b = Holder::spawn(HOLDER, &spec);
    a.finish(Duration::from_secs(60)).await;
    b.finish(Duration::from_secs(60)).await;
    let text = std::fs::read_to_string(marks.path()).unwrap();
    assert_eq!(check_marks(&text), 30);
}

/// A holder process frozen with SIGSTOP: the server ends its silent
/// session after `session_timeout`, another client is granted the key, and
/// the resumed holder finds its lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_is_freed_by_the_server() {
    let fixture = MysqlFixture::start();
    frozen_holder_case(HOLDER, fixture.url(), fixture.backend_for_tests().await).await;
}

/// An operator's `KILL` of one session: exactly the leases on it are lost,
/// within their ttl; the other session's lease lives on; the next holder's
/// fence is greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_loses_exactly_its_leases() {
    let fixture = MysqlFixture::with_options("sessions=2");
    let a = connect(fixture.url()).await;
    let b = connect(fixture.url()).await;
    an_ended_session_loses_exactly_its_leases(
        a,
        b,
        |key| fixture.holder(key),
        |id| {
            fixture.server().sql(&format!("KILL {id}"));
        },
        "killed",
    )
    .await;
}

/// The server frozen (SIGSTOP) longer than the ttl: the holder's renewals
/// get no answer and `lost()` fires by the lease's local deadline; once
/// the server goes on, the key is taken again (the old session's lock
/// freed when it is found broken), with a greater fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_loses_leases_in_time_and_recovers() {
    let mut fixture = MysqlFixture::with_options("timeout=1s");
    let backend = fixture.backend_for_tests().await;
    let ttl = Duration::from_secs(2);
    let at = a_lease_held_through(
        &mut fixture,
        &backend,
        ("paused", Some(ttl)),
        (
            |f: &mut MysqlFixture| f.server_mut().pause(),
            ttl + Duration::from_millis(500),
            "lost() by the local deadline while the server is frozen",
        ),
        (
            |f: &mut MysqlFixture| f.server_mut().resume(),
            "taken again once the server goes on",
        ),
    )
    .await;
    eprintln!("lease lost {at:?} after the server froze (ttl {ttl:?})");
    assert!(at <= ttl + Duration::from_millis(500), "{at:?}");
}

/// A frozen network path: every flow open now silently dead (a fault
/// proxy forgets them), new ones pass. The holder's lease is lost by its
/// local deadline, the server frees the silent session after
/// `session_timeout`, and a client on a new connection is served then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_flows_lose_the_lease_before_the_server_frees_it() {
    let fixture = MysqlFixture::start();
    let proxy = FaultProxy::start(fixture.server().addr()).await;
    let proxied = format!(
        "mysql://root@{}/dlock?session_timeout=3s&timeout=1s",
        proxy.addr()
    );
    let holder = connect(&proxied).await;
    let ttl = Duration::from_secs(2);
    let guard = lock(&holder, "flows").ttl(ttl).acquire().await.unwrap();
    let fence = guard.fencing_token().unwrap();
    let lost = guard.lost();
    let frozen = Instant::now();
    proxy.freeze_flows();
    tokio::time::timeout(ttl + Duration::from_millis(500), lost)
        .await
        .expect("lost() by the local deadline");
    let lost_at = frozen.elapsed();
    let direct = fixture.backend_for_tests().await;
    let next = lock(&direct, "flows")
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the server frees the silent session");
    let freed_at = frozen.elapsed();
    eprintln!(
        "frozen flows: lease lost after {lost_at:?}, lock free for others after {freed_at:?}"
    );
    assert!(
        lost_at < freed_at,
        "the holder still believed it held the lock when another got it"
    );
    assert!(next.fencing_token().unwrap() > fence);
    next.release().await.unwrap();
    // The holder's backend opens new sessions through the proxy.
    let again = lock(&holder, "flows")
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the first client recovers on new connections");
    again.release().await.unwrap();
}

/// Acquisitions dropped at every moment (a free key, where the drop may
/// land after the grant; a held key, where it lands in the server's
/// queue): no lock stays held, and the next client is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_dropped_at_every_await_leave_nothing_held() {
    let fixture = MysqlFixture::start();
    let a = fixture.backend_for_tests().await;
    let b = fixture.backend_for_tests().await;
    let c = fixture.backend_for_tests().await;
    let delays: Vec<Duration> = (0..40u64)
        .map(|i| Duration::from_micros(i * 250))
        .chain([5, 10, 20, 50, 100, 300].map(Duration::from_millis))
        .collect();
    for (round, &delay) in delays.iter().enumerate() {
        // A free key.
        let key = format!("cancel-free-{round}");
        let _ = tokio::time::timeout(delay, lock(&b, &key).wait(Duration::from_secs(5)).acquire())
            .await;
        let next = lock(&c, &key)
            .wait(Duration::from_secs(3))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("free key, dropped after {delay:?}: {e}"));
        next.release().await.unwrap();
        // A held key: the dropped acquisition was waiting.
        let key = format!("cancel-held-{round}");
        let held = lock(&a, &key).acquire().await.unwrap();
        let _ = tokio::time::timeout(delay, lock(&b, &key).acquire()).await;
        held.release().await.unwrap();
        let started = Instant::now();
        let next = lock(&c, &key)
            .wait(Duration::from_secs(3))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("held key, waiter dropped after {delay:?}: {e}"));
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(2),
            "after {delay:?}: {waited:?}"
        );
        next.release().await.unwrap();
    }
    // Nothing of b's stays held anywhere.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = fixture
        .server()
        .sql("SELECT COUNT(*) FROM dlock_fences WHERE IS_USED_LOCK(name) IS NOT NULL");
    assert_eq!(held, "0");
    // b still works.
    let guard = lock(&b, "cancel-after")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}
