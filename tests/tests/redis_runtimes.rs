//! The Redis backend's connection stays on dlock's background runtime, also
//! when a request of another runtime is what reconnects it.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockError, LockGuard};
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::redis::RedisServer;
use tokio::runtime::Builder;

/// A connection cut while idle is reconnected by the next request, here an
/// acquisition on a current-thread runtime that then sits idle (the
/// synchronous program's pattern). The new connection must not live on
/// that runtime: renewal keeps the lease for three ttls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_started_on_an_idle_runtime_keeps_renewing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let ttl = Duration::from_millis(900);
    let key = "reconnect-on-idle";
    let other: Arc<dyn LockBackend> = Arc::new(
        RedisBackend::connect(&server.url())
            .await
            .expect("connect to the test server"),
    );
    let url = format!("redis://{}", proxy.addr());
    // The test's runtime (which runs the proxy) is a multi-thread one:
    // `block_in_place` lets this thread block and run a runtime of its own.
    let (idle, guard, failed) = tokio::task::block_in_place(|| {
        let idle = Builder::new_current_thread().enable_all().build().unwrap();
        let backend: Arc<dyn LockBackend> = Arc::new(
            idle.block_on(RedisBackend::connect(&url))
                .expect("connect through the proxy"),
        );
        // Cut the connection while nothing uses it: no lease is held, so no
        // renewal can be the first request to find it broken.
        proxy.reset();
        std::thread::sleep(Duration::from_millis(300));
        proxy.pass();
        let lock = Lock::new(key).ttl(ttl).with_backend(backend);
        let (guard, failed) = idle.block_on(async {
            let mut failed = 0;
            loop {
                match lock.try_acquire().await {
                    Ok(Some(guard)) => break (guard, failed),
                    Ok(None) => panic!("nobody else holds {key}"),
                    // The request that found the connection broken, and
                    // any sent while it reconnects.
                    Err(LockError::Backend { .. }) if failed < 40 => {
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("acquire after the cut: {e}"),
                }
            }
        });
        // Synchronous work; `idle` is not driven meanwhile.
        std::thread::sleep(ttl * 3);
        (idle, guard, failed)
    });
    assert!(
        failed >= 1,
        "no acquisition saw the cut: the reconnect was not started on the idle runtime"
    );
    assert!(
        guard.is_held(),
        "the lease lapsed: the connection moved to the idle runtime when it reconnected"
    );
    assert!(
        Lock::new(key)
            .with_backend(other.clone())
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "another client took a key whose holder still believes it holds it"
    );
    tokio::task::block_in_place(|| {
        let released: Result<(), LockError> = idle.block_on(LockGuard::release(guard));
        released.expect("release on the idle runtime");
        drop(idle);
    });
}
