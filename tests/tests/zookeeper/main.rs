//! ZooKeeper-specific behaviour on a real server: queue fairness, interop with
//! Apache Curator's `InterProcessMutex`, session expiry (and the start-over
//! of an acquisition on a session expired unknown to the client, for locks
//! and read-write locks alike), a crashed holder process, a stopped server,
//! key escaping and the node layout. (Read-write locks otherwise:
//! `zookeeper_rw.rs`.)
//!
//! Every wait is bounded; servers run on free loopback ports in temp dirs and
//! stop when their fixture is dropped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{distributed_lock, Lock, LockBackend, LockError, LockGuard, RwLock, MAX_TTL};
use dlock_tests::acquisitions::acquire_and_release;
use dlock_tests::curator::Curator;
use dlock_tests::fixtures::zookeeper::{ZkFixture, ZkServers, SESSION_TIMEOUT};
use dlock_tests::holder::{Holder, HolderSpec};
use dlock_tests::poll::eventually;
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::zookeeper::{ZkServer, ZkTls};
use dlock_tests::tls::TestCerts;
use dlock_tests::urls::invalid_option;

async fn backend(fixture: &ZkFixture) -> Arc<ZooKeeperBackend> {
    Arc::new(
        ZooKeeperBackend::connect(fixture.url())
            .await
            .expect("connect to the fixture"),
    )
}

fn lock(backend: &Arc<ZooKeeperBackend>, key: &str) -> Lock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    Lock::new(key).with_backend(backend)
}

fn rw_lock(backend: &Arc<ZooKeeperBackend>, key: &str) -> RwLock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    RwLock::new(key).with_backend(backend)
}

/// What a test takes: a plain lock, or a side of the key's read-write
/// lock; all go through one acquire loop.
#[derive(Debug, Clone, Copy)]
enum Take {
    Lock,
    Read,
    Write,
    /// One permit of a semaphore of 2, named by the key.
    Permit,
}

/// What a [`Take`] holds.
enum Held {
    Guard(LockGuard),
    Permit(dlock::Permit),
}

impl Held {
    fn fencing_token(&self) -> Option<u64> {
        match self {
            Held::Guard(guard) => guard.fencing_token(),
            Held::Permit(_) => None,
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Held::Guard(guard) => guard.release().await,
            Held::Permit(permit) => permit.release().await,
        }
    }
}

impl Take {
    async fn acquire(
        self,
        b: &Arc<ZooKeeperBackend>,
        key: &str,
        wait: Duration,
    ) -> Result<Held, LockError> {
        match self {
            Take::Lock => lock(b, key).wait(wait).acquire().await.map(Held::Guard),
            Take::Read => rw_lock(b, key).wait(wait).read().await.map(Held::Guard),
            Take::Write => rw_lock(b, key).wait(wait).write().await.map(Held::Guard),
            Take::Permit => dlock::Semaphore::new(key, 2)
                .with_backend(b.clone())
                .wait(wait)
                .acquire()
                .await
                .map(Held::Permit),
        }
    }

    /// The nodes queued for what `self` takes of `key`.
    async fn nodes(self, fixture: &ZkFixture, key: &str) -> Vec<String> {
        match self {
            Take::Lock => fixture.contenders(key).await,
            Take::Read | Take::Write => fixture.rw_contenders(key).await,
            Take::Permit => fixture.permit_contenders(key).await,
        }
    }
}

mod acl;
mod faults;
mod layout;
mod limits;
mod loss_heard;
mod queue;
mod runtimes;
mod sessions;
mod tls;
