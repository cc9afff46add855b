//! A reader process killed with SIGKILL: its share of a read-write lock
//! frees after its ttl, on any backend reachable by URL from another
//! process. Each backend's fault tests call
//! [`a_killed_readers_share_frees_after_its_ttl`] with its own server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockBackend, RwLock};

use crate::conformance::unique_key;
use crate::holder::Holder;

/// What the caller knows about its backend.
pub struct CrashedReader<'a> {
    /// `env!("CARGO_BIN_EXE_reader-holder")` of the calling test.
    pub binary: &'a str,
    /// The URL the reader process connects to.
    pub url: &'a str,
    /// A client in this process, to the same service.
    pub backend: Arc<dyn LockBackend>,
    /// The reader process's lease ttl.
    pub ttl: Duration,
    /// The longest a dead reader's share may outlive its death: its ttl
    /// plus the backend's granularity (etcd rounds leases up to whole
    /// seconds, ZooKeeper's is the session timeout).
    pub frees_within: Duration,
}

/// A reader process holds a read lease beside a reader here; it is killed
/// with SIGKILL. Its share stays until the server expires it (a writer is
/// still kept out right after the kill), the reader here keeps its own
/// lease, and once that is released a waiting writer gets in within
/// `frees_within` of the kill, no sooner than half the ttl (the dead
/// reader's lease was renewed at most a third of a ttl before it died).
pub async fn a_killed_readers_share_frees_after_its_ttl(crash: CrashedReader<'_>) {
    let key = unique_key("rw-crash");
    let lock = RwLock::new(key.as_str()).with_backend(crash.backend.clone());
    let mut process = Holder::spawn_reader(
        crash.binary,
        crash.url,
        &key,
        crash.ttl,
        Duration::from_secs(120),
    );
    process.acquired(Duration::from_secs(30)).await;
    let here = lock
        .try_read()
        .await
        .expect("read beside the process")
        .expect("readers share: the process's read lease must not keep this reader out");
    assert!(
        lock.try_write().await.unwrap().is_none(),
        "a writer got in beside two readers"
    );

    process.kill9().await;
    let killed = Instant::now();
    assert!(
        lock.try_write().await.unwrap().is_none(),
        "the dead reader's share freed at once: the server cannot know yet, so nothing held it"
    );
    let writer = {
        let lock = lock
            .clone()
            .wait(crash.frees_within + Duration::from_secs(30));
        tokio::spawn(async move { lock.write().await.map(|guard| (guard, Instant::now())) })
    };
    // The reader here is unaffected by the other's death.
    tokio::time::sleep(crash.ttl / 3).await;
    assert!(here.is_held(), "the surviving reader lost its lease");
    assert!(
        !writer.is_finished(),
        "a writer got in beside a live reader"
    );
    here.release().await.expect("release the surviving reader");

    let (guard, got) = tokio::time::timeout(crash.frees_within + Duration::from_secs(40), writer)
        .await
        .expect("the writer never got in: the dead reader's share never freed")
        .expect("the writer task")
        .expect("the writer's acquire");
    let after = got - killed;
    assert!(
        after <= crash.frees_within,
        "the dead reader's share freed {after:?} after the kill; bound {:?}",
        crash.frees_within
    );
    assert!(
        after >= crash.ttl / 2,
        "the writer got in {after:?} after the kill, before the dead reader's ttl {:?} could run out",
        crash.ttl
    );
    guard.release().await.expect("release the writer");
}
