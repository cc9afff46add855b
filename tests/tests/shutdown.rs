//! `dlock::shutdown` against a real Redis server, in a test binary of its
//! own: it releases every lease of the process.

use std::time::Duration;

use dlock::{Lock, LockError};
use dlock_tests::servers::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_lease_and_later_drops_do_nothing() {
    let server = RedisServer::start();
    let ours = dlock::connect(&server.url()).await.unwrap();
    let other = dlock::connect(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(30);
    let a = Lock::new("shutdown:a")
        .ttl(ttl)
        .with_backend(ours.clone())
        .acquire()
        .await
        .unwrap();
    let b = Lock::new("shutdown:b")
        .ttl(ttl)
        .with_backend(ours.clone())
        .acquire()
        .await
        .unwrap();
    let permit = dlock::Semaphore::new("shutdown:s", 1)
        .ttl(ttl)
        .with_backend(ours.clone())
        .acquire()
        .await
        .unwrap();
    let lost = a.lost();

    assert_eq!(dlock::shutdown().await, 3);

    for key in ["shutdown:a", "shutdown:b"] {
        let lock = Lock::new(key).with_backend(other.clone());
        assert_eq!(lock.inspect().await.unwrap(), None, "{key} still held");
    }
    assert!(!a.is_held() && !b.is_held());
    let taken = Lock::new("shutdown:a")
        .with_backend(other.clone())
        .acquire()
        .await
        .unwrap();
    // The released guard's drop does nothing: the new holder keeps the key.
    drop(b);
    let err = a.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
    drop(permit);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(taken.is_held());
    let info = Lock::new("shutdown:a")
        .with_backend(ours)
        .inspect()
        .await
        .unwrap();
    assert_eq!(info.and_then(|i| i.fencing_token), taken.fencing_token());
    // Given back, not lost.
    assert!(tokio::time::timeout(Duration::from_millis(100), lost)
        .await
        .is_err());
    taken.release().await.unwrap();
}
