//! etcd: an enqueue given up while its flow stalls leaves no entry in line.

use std::time::{Duration, Instant};

use dlock::{Lock, RwLock};
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::etcd::EtcdServer;

use super::{connect, WAIT};

/// An acquisition given up while its enqueue is held in the network (its
/// wait ends while the connection it was sent on stalls for 8 s; new
/// connections pass, so the cleanup goes first) leaves nothing in line once
/// the enqueue lands late: the backend that sent it, still alive and
/// keeping its session, deletes the entry, so another client's wait for
/// the same lock is served, for a plain lock and a write lock on etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_an_enqueue_given_up_in_a_pause_leaves_no_entry_in_line() {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let proxied = connect(&format!("etcd://{}", proxy.addr())).await;
    let direct = connect(&server.url()).await;
    // Warm: the proxied backend's session and connection exist.
    let warm = Lock::new("warm").with_backend(proxied.clone());
    warm.acquire().await.unwrap().release().await.unwrap();
    proxy.hold_flows();
    let short = Duration::from_secs(2);
    let lock = Lock::new("late-lock")
        .with_backend(proxied.clone())
        .wait(short);
    let rw = RwLock::new("late-rw")
        .with_backend(proxied.clone())
        .wait(short);
    let (lock_ended, rw_ended) = tokio::join!(lock.acquire(), rw.write());
    assert!(lock_ended.is_err(), "a lock granted with every byte held");
    assert!(
        rw_ended.is_err(),
        "a write lock granted with every byte held"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    proxy.release_flows();
    let back = Instant::now();
    let lock = Lock::new("late-lock")
        .with_backend(direct.clone())
        .wait(WAIT);
    let rw = RwLock::new("late-rw")
        .with_backend(direct.clone())
        .wait(WAIT);
    let (lock_got, rw_got) = tokio::join!(
        async {
            let guard = lock.acquire().await;
            (guard, back.elapsed())
        },
        async {
            let guard = rw.write().await;
            (guard, back.elapsed())
        }
    );
    let (lock_guard, lock_after) = lock_got;
    let (rw_guard, rw_after) = rw_got;
    let lock_guard = lock_guard.expect("the lock stayed blocked by a late enqueue");
    let rw_guard = rw_guard.expect("the write lock stayed blocked by a late enqueue");
    eprintln!(
        "etcd: enqueues given up in an 8 s pause: another client's lock after {lock_after:?}, write lock after {rw_after:?}"
    );
    lock_guard.release().await.unwrap();
    rw_guard.release().await.unwrap();
    drop(proxied);
}
