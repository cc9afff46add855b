//! Read-write locks on a real ZooKeeper server: the node layout (Curator's
//! `InterProcessReadWriteLock`, apart from the key's plain lock), a
//! cancelled or timed-out writer that leaves no node, and interop with
//! Curator's read-write lock in a JVM, both ways.
//!
//! Every wait is bounded; the server runs on a free loopback port in a temp
//! dir and stops when its fixture is dropped.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{Lock, LockBackend, LockError, LockGuard, RwLock};
use dlock_tests::curator::Curator;
use dlock_tests::fixtures::zookeeper::ZkFixture;
use dlock_tests::poll::eventually;
use dlock_tests::rw::a_late_reader_gets_in_and_the_writer_times_out;
use tokio::task::JoinHandle;

async fn backend(fixture: &ZkFixture) -> Arc<ZooKeeperBackend> {
    Arc::new(
        ZooKeeperBackend::connect(fixture.url())
            .await
            .expect("connect to the fixture"),
    )
}

fn rw(backend: &Arc<ZooKeeperBackend>, key: &str) -> RwLock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    RwLock::new(key).with_backend(backend)
}

/// Waits (at most 10 s) until the read-write lock `key` has `n` nodes.
async fn queued(fixture: &ZkFixture, key: &str, n: usize) {
    let what = format!("{n} nodes under the read-write lock {key}");
    eventually(&what, Duration::from_secs(10), || async {
        fixture.rw_contenders(key).await.len() == n
    })
    .await;
}

/// `lock.read()` or `lock.write()` in a task of its own.
fn in_background(lock: RwLock, write: bool) -> JoinHandle<Result<LockGuard, LockError>> {
    tokio::spawn(async move {
        if write {
            lock.write().await
        } else {
            lock.read().await
        }
    })
}

/// The guard a background acquisition got, within 10 s.
async fn granted(task: JoinHandle<Result<LockGuard, LockError>>, what: &str) -> LockGuard {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not granted within 10 s"))
        .expect("the acquiring task panicked")
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// How long a holder that must not be granted is watched for it: long
/// enough for a wrong grant to show (a listing and an answer away), and
/// it only slows the passing case.
const NOT_GRANTED_FOR: Duration = Duration::from_millis(300);

/// The uuid and sequence of a protected node `_c_<uuid>-<name><seq>`,
/// checking the shape of each.
fn parts<'a>(node: &'a str, name: &str) -> (&'a str, i64) {
    let rest = node
        .strip_prefix("_c_")
        .unwrap_or_else(|| panic!("{node}: no protection prefix"));
    let (uuid, seq) = rest
        .split_once(&format!("-{name}"))
        .unwrap_or_else(|| panic!("{node}: not a {name} node"));
    assert_eq!(uuid.len(), 36, "{node}: the uuid");
    assert_eq!(uuid.matches('-').count(), 4, "{node}: the uuid");
    assert_eq!(seq.len(), 10, "{node}: ZooKeeper's ten-digit sequence");
    (uuid, seq.parse().expect("a numeric sequence"))
}

/// Read and write nodes are `_c_<uuid>-__READ__<seq>` and
/// `_c_<uuid>-__WRIT__<seq>`, ephemeral on the holder's session, under
/// `/dlock-rw/<escaped key>`, in one sequence; the fencing token is the
/// node's czxid. A plain lock of the same key lives under `/dlock/<key>`
/// and is taken while the write lease is held: the two are apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_nodes_use_curators_layout_apart_from_the_plain_lock() {
    let fixture = ZkFixture::start().await;
    let key = "prices/eu";
    let dir = fixture.rw_lock_path(key);
    assert_eq!(dir, "/dlock-rw/prices%2Feu");
    assert_eq!(fixture.lock_path(key), "/dlock/prices%2Feu");
    let (a, b) = (backend(&fixture).await, backend(&fixture).await);
    let admin = fixture.admin();

    let readers = [
        rw(&a, key).read().await.unwrap(),
        rw(&b, key).read().await.unwrap(),
    ];
    let nodes = fixture.rw_contenders(key).await;
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let mut read_seqs = Vec::new();
    for node in &nodes {
        let (_, seq) = parts(node, "__READ__");
        read_seqs.push(seq);
        let (_, stat) = admin.get_data(&format!("{dir}/{node}")).await.unwrap();
        let holder = readers
            .iter()
            .position(|r| r.fencing_token() == u64::try_from(stat.czxid).ok())
            .unwrap_or_else(|| panic!("{node}: its czxid is no reader's fencing token"));
        let session = [&a, &b][holder].client().unwrap().session_id();
        assert_eq!(
            stat.ephemeral_owner, session.0,
            "{node}: not ephemeral on its holder's session"
        );
    }
    assert!(
        rw(&b, key).try_write().await.unwrap().is_none(),
        "a writer got in beside readers"
    );
    assert_eq!(
        fixture.rw_contenders(key).await,
        nodes,
        "a try_write left its node"
    );
    for reader in readers {
        reader.release().await.unwrap();
    }

    let writer = rw(&a, key).write().await.unwrap();
    let nodes = fixture.rw_contenders(key).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let (_, write_seq) = parts(&nodes[0], "__WRIT__");
    assert!(
        read_seqs.iter().all(|r| *r < write_seq),
        "reads {read_seqs:?} and the later write {write_seq} are not in one sequence"
    );
    let (_, stat) = admin
        .get_data(&format!("{dir}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(writer.fencing_token(), u64::try_from(stat.czxid).ok());
    assert_eq!(stat.ephemeral_owner, a.client().unwrap().session_id().0);

    let backend_b: Arc<dyn LockBackend> = b.clone();
    let plain = Lock::new(key)
        .with_backend(backend_b)
        .try_acquire()
        .await
        .unwrap()
        .expect("the plain lock of the key is apart from its read-write lock");
    let lock_nodes = fixture.contenders(key).await;
    assert_eq!(lock_nodes.len(), 1, "{lock_nodes:?}");
    parts(&lock_nodes[0], "lock-");
    assert!(
        rw(&b, key).try_read().await.unwrap().is_none(),
        "a reader got in beside the writer"
    );
    plain.release().await.unwrap();
    writer.release().await.unwrap();
    assert!(fixture.rw_contenders(key).await.is_empty());
    assert!(fixture.contenders(key).await.is_empty());
}

/// A writer waiting behind a reader keeps new readers out; once its
/// `write()` is cancelled (the task aborted), its node goes and readers get
/// in again. A writer whose wait runs out has deleted its node by the time
/// `write()` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_or_timed_out_writer_leaves_no_node() {
    let fixture = ZkFixture::start().await;
    let key = "cancelled-writer";
    let (a, b, c) = (
        backend(&fixture).await,
        backend(&fixture).await,
        backend(&fixture).await,
    );
    let reader = rw(&a, key).read().await.unwrap();
    let writing = in_background(rw(&b, key).wait(Duration::from_secs(60)), true);
    queued(&fixture, key, 2).await;
    assert!(
        rw(&c, key).try_read().await.unwrap().is_none(),
        "a reader got in ahead of a waiting writer"
    );
    writing.abort();
    assert!(writing.await.unwrap_err().is_cancelled());
    queued(&fixture, key, 1).await;
    a_late_reader_gets_in_and_the_writer_times_out(
        &rw(&c, key),
        &rw(&b, key),
        "a cancelled writer still keeps readers out",
    )
    .await;
    assert_eq!(
        fixture.rw_contenders(key).await.len(),
        1,
        "a timed-out writer left its node"
    );
    reader.release().await.unwrap();
    assert!(fixture.rw_contenders(key).await.is_empty());
}

/// Curator's `InterProcessReadWriteLock` on `rw_lock_path(key)` and dlock's
/// `RwLock` on `key` are one lock: a Curator writer blocks dlock readers, a
/// dlock writer blocks Curator readers and writers, Curator and dlock
/// readers hold at once, and a waiting writer of either is not overtaken by
/// a later reader of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_read_write_lock_and_dlock_interoperate() {
    let fixture = ZkFixture::start().await;
    let key = "interop";
    let connect = fixture.connect_string();
    let mut curator = Curator::read_write(
        &connect,
        &fixture.rw_lock_path(key),
        Duration::from_secs(30),
    )
    .await;
    let (a, b) = (backend(&fixture).await, backend(&fixture).await);
    let answer = Duration::from_secs(10);

    // A Curator writer blocks dlock readers until it releases.
    curator.send("W write 10000").await;
    assert_eq!(curator.answer("W", answer).await, "ACQUIRED");
    assert!(
        rw(&a, key).try_read().await.unwrap().is_none(),
        "a dlock reader got in beside a Curator writer"
    );
    let reading = in_background(rw(&a, key).wait(Duration::from_secs(20)), false);
    queued(&fixture, key, 2).await;
    tokio::time::sleep(NOT_GRANTED_FOR).await;
    assert!(
        !reading.is_finished(),
        "a dlock reader was granted while a Curator writer held"
    );
    curator.send("W release").await;
    assert_eq!(curator.answer("W", answer).await, "RELEASED");
    let reader = granted(reading, "a dlock reader after the Curator writer").await;

    // Readers share: a Curator reader beside a dlock reader, and another
    // dlock reader beside both.
    curator.send("R read 5000").await;
    assert_eq!(
        curator.answer("R", answer).await,
        "ACQUIRED",
        "a Curator reader kept out by a dlock reader"
    );
    let second = rw(&b, key).try_read().await.unwrap();
    let second = second.expect("a dlock reader kept out by a Curator reader");
    assert!(reader.is_held());
    second.release().await.unwrap();
    reader.release().await.unwrap();
    curator.send("R release").await;
    assert_eq!(curator.answer("R", answer).await, "RELEASED");

    // A dlock writer blocks Curator readers and writers until it releases.
    let writer = rw(&a, key).try_write().await.unwrap();
    let writer = writer.expect("the lock is free");
    curator.send("R read 500").await;
    assert_eq!(
        curator.answer("R", answer).await,
        "TIMEOUT",
        "a Curator reader got in beside a dlock writer"
    );
    curator.send("W write 500").await;
    assert_eq!(
        curator.answer("W", answer).await,
        "TIMEOUT",
        "a Curator writer got in beside a dlock writer"
    );
    curator.send("R read 20000").await;
    queued(&fixture, key, 2).await;
    assert!(
        !curator.has_answered("R", NOT_GRANTED_FOR).await,
        "a waiting Curator reader answered while a dlock writer held"
    );
    writer.release().await.unwrap();
    assert_eq!(curator.answer("R", answer).await, "ACQUIRED");

    // A Curator writer waiting behind the Curator reader is not overtaken
    // by a later dlock reader: it holds first, the dlock reader after it.
    curator.send("W write 20000").await;
    queued(&fixture, key, 2).await;
    assert!(
        rw(&b, key).try_read().await.unwrap().is_none(),
        "a dlock reader overtook a waiting Curator writer"
    );
    let late = in_background(rw(&b, key).wait(Duration::from_secs(20)), false);
    queued(&fixture, key, 3).await;
    curator.send("R release").await;
    assert_eq!(curator.answer("R", answer).await, "RELEASED");
    assert_eq!(curator.answer("W", answer).await, "ACQUIRED");
    tokio::time::sleep(NOT_GRANTED_FOR).await;
    assert!(
        !late.is_finished(),
        "a later dlock reader was granted beside the Curator writer"
    );
    curator.send("W release").await;
    assert_eq!(curator.answer("W", answer).await, "RELEASED");
    let late = granted(late, "the later dlock reader after the Curator writer").await;

    // The reverse: a dlock writer waiting behind that dlock reader is not
    // overtaken by a later Curator reader.
    let writing = in_background(rw(&a, key).wait(Duration::from_secs(20)), true);
    queued(&fixture, key, 2).await;
    curator.send("R read 500").await;
    assert_eq!(
        curator.answer("R", answer).await,
        "TIMEOUT",
        "a Curator reader overtook a waiting dlock writer"
    );
    late.release().await.unwrap();
    let writer = granted(writing, "a dlock writer after the reader ahead of it").await;
    writer.release().await.unwrap();

    curator.exits_cleanly().await;
    assert!(
        fixture.rw_contenders(key).await.is_empty(),
        "nodes left behind"
    );
}
