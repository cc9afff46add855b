//! etcd-specific behaviour on real etcd servers: FIFO fairness, interop with
//! `etcdctl lock` both ways, deeper keys (another resource's) ignored, a
//! leader killed under a held lock, the whole cluster stopped, a holder
//! process killed with SIGKILL, auth and TLS; a barrier member whose
//! session lease is revoked.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, PermitRequest, Renewal};
use dlock::backends::etcd::EtcdBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::acquisitions::{acquire_and_release, got_within, wait_for};
use dlock_tests::fixtures::etcd::{queue_prefix, EtcdFixture};
use dlock_tests::holder::{Holder, HolderSpec};
use dlock_tests::overlap::OverlapDetector;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::etcd::{EtcdServer, ETCD_PACKAGES};
use dlock_tests::servers::process::require_binary;
use dlock_tests::urls::invalid_option;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        EtcdBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
    )
}

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// Runs blocking harness work (etcdctl, killing servers) without stalling the runtime.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(work)
}

/// Polls (bounded) until the server-side queue of `key` has `len` entries.
async fn wait_for_queue(fixture: &EtcdFixture, key: &str, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queue = blocking(|| fixture.queue(key));
        if queue.len() >= len {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the queue of {key} never reached {len} entries: {queue:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waiters, each its own client, queued one after another behind a holder;
/// each records when it gets the lock and holds it for a moment.
struct QueuedWaiters {
    count: usize,
    order: Arc<Mutex<Vec<usize>>>,
    overlap: Arc<OverlapDetector>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl QueuedWaiters {
    /// Starts `count` waiters on `key`, each with the lock `lock_for` makes
    /// on its own client, and holding it for `hold`. Waiter i is on the
    /// server before waiter i+1 starts.
    async fn queue(
        fixture: &EtcdFixture,
        key: &str,
        count: usize,
        lock_for: impl Fn(&Arc<dyn LockBackend>) -> Lock,
        hold: Duration,
    ) -> Self {
        let order = Arc::new(Mutex::new(Vec::new()));
        let overlap = Arc::new(OverlapDetector::default());
        let mut tasks = Vec::new();
        for i in 0..count {
            let lock = lock_for(&connect(fixture.url()).await);
            let (order, overlap) = (order.clone(), overlap.clone());
            tasks.push(tokio::spawn(async move {
                let guard = lock.acquire().await.expect("a waiter did not get the lock");
                overlap.enter();
                order.lock().unwrap().push(i);
                tokio::time::sleep(hold).await;
                overlap.leave();
                guard.release().await.unwrap();
            }));
            wait_for_queue(fixture, key, i + 2).await;
        }
        QueuedWaiters {
            count,
            order,
            overlap,
            tasks,
        }
    }

    /// All the waiters finish within 30 s, got the lock in the order they
    /// queued in, and never two at once.
    async fn are_served_in_order(self) {
        tokio::time::timeout(Duration::from_secs(30), async {
            for task in self.tasks {
                task.await.expect("a waiter panicked");
            }
        })
        .await
        .expect("the waiters did not finish within 30 s");
        assert_eq!(
            *self.order.lock().unwrap(),
            (0..self.count).collect::<Vec<_>>()
        );
        assert_eq!(self.overlap.overlaps(), 0);
    }
}

mod access;
mod barrier;
mod deeper_keys;
mod etcdctl;
mod faults;
mod loss_heard;
mod queue;
mod sessions;
