//! Read-write locks on etcd, key by key: the layout of etcd's recipe
//! `RWMutex` read with etcdctl, and dlock against keys written and waited on
//! as a Go `recipe.RWMutex` would (`dlock_tests::etcd_recipe`; Go itself is
//! not on this machine), both ways; a cancelled writer leaves no key.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlock::backends::etcd::EtcdBackend;
use dlock::{Lock, LockBackend, RwLock};
use dlock_tests::etcd_recipe::GoSession;
use dlock_tests::fixtures::etcd::{queue_prefix, rw_prefix, EtcdFixture, RwEntry};
use dlock_tests::rw::a_late_reader_gets_in_and_the_writer_times_out;

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        EtcdBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
    )
}

/// A read-write lock whose `read()`/`write()` wait at most 10 s unless
/// told otherwise, so no test can hang on them.
fn rw(backend: &Arc<dyn LockBackend>, key: &str) -> RwLock {
    RwLock::new(key)
        .with_backend(backend.clone())
        .wait(Duration::from_secs(10))
}

/// Runs blocking harness work (etcdctl) without stalling the runtime.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(work)
}

/// Polls (bounded) until the read-write lock of `key` has `len` keys.
async fn wait_for_entries(fixture: &EtcdFixture, key: &str, len: usize) -> Vec<RwEntry> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let entries = blocking(|| fixture.rw_entries(key));
        if entries.len() == len {
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "the read-write lock of {key} never had {len} keys: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reader holds, a writer waits behind it, a second reader waits behind
/// the writer (three clients). etcd shows exactly the recipe's keys: names
/// `<prefix>-rw/<key>/read|write/<nanoseconds>`, empty values, each on a
/// lease granted with the ttl, in arrival order; the recipe's rule finds
/// each waiter's blocker where dlock waits; every guard's fencing token is
/// its key's create revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layout_is_the_recipes_key_by_key() {
    let fixture = EtcdFixture::single();
    let key = "prices";
    let ttl = Duration::from_secs(5);
    let (a, b, c) = (
        connect(fixture.url()).await,
        connect(fixture.url()).await,
        connect(fixture.url()).await,
    );
    let started_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let reader = rw(&a, key).ttl(ttl).read().await.unwrap();
    let writing = {
        let lock = rw(&b, key).ttl(ttl).wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.write().await })
    };
    wait_for_entries(&fixture, key, 2).await;
    let reading = {
        let lock = rw(&c, key).ttl(ttl).wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.read().await })
    };
    let entries = wait_for_entries(&fixture, key, 3).await;

    let dir = format!("{}/", rw_prefix(key));
    assert_eq!(dir, "dlock-rw/prices/");
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| {
            let rest = e.key.strip_prefix(&dir).expect("a key outside the prefix");
            let (kind, n) = rest.split_once('/').expect("<kind>/<n>");
            let ns: u128 = n.parse().unwrap_or_else(|_| panic!("{n} is no number"));
            assert!(
                ns >= started_ns && ns < started_ns + 60_000_000_000,
                "{n} is not the nanoseconds of its creation"
            );
            kind
        })
        .collect();
    assert_eq!(kinds, ["read", "write", "read"], "{entries:?}");
    for entry in &entries {
        assert_eq!(entry.value, "", "{entry:?}");
        assert_eq!(
            entry.mod_revision, entry.create_revision,
            "created once: {entry:?}"
        );
        assert_ne!(entry.lease, 0, "no lease: {entry:?}");
        assert_eq!(blocking(|| fixture.lease_granted_secs(entry.lease)), 5);
    }
    assert_eq!(
        reader.fencing_token(),
        Some(entries[0].create_revision as u64)
    );

    // The recipe's rule, asked as a Go waiter would: the writer waits for
    // the reader, the second reader for the writer.
    let go = GoSession::start(fixture.url(), 10).await;
    let recipe = go.rw_mutex(&rw_prefix(key));
    let as_go = |e: &RwEntry, write| dlock_tests::etcd_recipe::GoKey {
        key: e.key.clone(),
        revision: e.mod_revision,
        write,
    };
    assert_eq!(
        recipe.blocker(&as_go(&entries[1], true)).await,
        Some(entries[0].key.clone())
    );
    assert_eq!(
        recipe.blocker(&as_go(&entries[2], false)).await,
        Some(entries[1].key.clone())
    );

    reader.release().await.unwrap();
    let writer = tokio::time::timeout(Duration::from_secs(5), writing)
        .await
        .expect("the writer did not hold within 5 s of the reader's release")
        .unwrap()
        .unwrap();
    assert_eq!(
        writer.fencing_token(),
        Some(entries[1].create_revision as u64)
    );
    assert!(!reading.is_finished(), "a reader got in with the writer");
    writer.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), reading)
        .await
        .expect("the second reader did not hold within 5 s of the writer's release")
        .unwrap()
        .unwrap();
    assert_eq!(
        second.fencing_token(),
        Some(entries[2].create_revision as u64)
    );
    second.release().await.unwrap();
    assert!(blocking(|| fixture.rw_entries(key)).is_empty());
}

/// A "Go" writer's key blocks dlock readers and writers until it is
/// deleted; a "Go" reader shares with dlock readers and blocks a dlock
/// writer; a "Go" writer waits for a dlock reader's key and holds after its
/// release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_recipe_keys_block_dlock_and_dlock_keys_block_them() {
    let fixture = EtcdFixture::single();
    let key = "rates";
    let ours = connect(fixture.url()).await;
    let go = GoSession::start(fixture.url(), 10).await;
    let recipe = go.rw_mutex(&rw_prefix(key));

    // A Go writer holds: dlock neither reads nor writes.
    let go_writer = recipe.create(true).await;
    recipe
        .wait_until_held(&go_writer, Duration::from_secs(2))
        .await;
    assert!(rw(&ours, key).try_read().await.unwrap().is_none());
    assert!(rw(&ours, key).try_write().await.unwrap().is_none());
    let reading = {
        let lock = rw(&ours, key).wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.read().await })
    };
    let entries = wait_for_entries(&fixture, key, 2).await;
    assert_eq!(entries[0].key, go_writer.key);
    assert_eq!(entries[0].lease, go.lease());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !reading.is_finished(),
        "a dlock reader got in while a Go writer held"
    );
    recipe.unlock(&go_writer).await;
    let reader = tokio::time::timeout(Duration::from_secs(5), reading)
        .await
        .expect("the dlock reader did not hold within 5 s of the Go writer's unlock")
        .unwrap()
        .unwrap();
    assert!(reader.fencing_token().unwrap() > go_writer.revision as u64);

    // A Go reader shares with the dlock reader at once.
    let go_reader = recipe.create(false).await;
    assert_eq!(recipe.blocker(&go_reader).await, None);

    // A Go writer now waits for both readers, the newest one first.
    let go_writer = recipe.create(true).await;
    assert_eq!(
        recipe.blocker(&go_writer).await,
        Some(go_reader.key.clone())
    );
    recipe.unlock(&go_reader).await;
    let ours_key = blocking(|| fixture.rw_entries(key))[0].key.clone();
    assert_eq!(recipe.blocker(&go_writer).await, Some(ours_key));
    let waiting = {
        let recipe = go.rw_mutex(&rw_prefix(key));
        let go_writer = go_writer.clone();
        tokio::spawn(async move {
            recipe
                .wait_until_held(&go_writer, Duration::from_secs(5))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a Go writer got in while a dlock reader held"
    );
    // dlock readers that come after the waiting Go writer wait too.
    assert!(rw(&ours, key).try_read().await.unwrap().is_none());
    reader.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the Go writer did not hold after the dlock reader's release")
        .unwrap();
    recipe.unlock(&go_writer).await;

    // A Go reader holds: a dlock writer waits until it lets go.
    let go_reader = recipe.create(false).await;
    let writing = {
        let lock = rw(&ours, key).wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.write().await })
    };
    wait_for_entries(&fixture, key, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !writing.is_finished(),
        "a dlock writer got in while a Go reader held"
    );
    recipe.unlock(&go_reader).await;
    let writer = tokio::time::timeout(Duration::from_secs(5), writing)
        .await
        .expect("the dlock writer did not hold after the Go reader's unlock")
        .unwrap()
        .unwrap();
    writer.release().await.unwrap();
}

/// A dlock writer's key is what a Go reader waits on by the recipe's rule:
/// the Go reader holds only after the dlock writer's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlock_writer_blocks_a_go_reader() {
    let fixture = EtcdFixture::single();
    let key = "tenant/7";
    let etcd = EtcdBackend::connect(fixture.url()).await.unwrap();
    assert_eq!(etcd.rw_prefix(key), "dlock-rw/tenant%2F7");
    assert_eq!(etcd.rw_prefix(key), rw_prefix(key));
    let ours: Arc<dyn LockBackend> = Arc::new(etcd);
    let writer = rw(&ours, key).write().await.unwrap();
    let go = GoSession::start(fixture.url(), 10).await;
    let recipe = go.rw_mutex(&rw_prefix(key));
    let go_reader = recipe.create(false).await;
    let writer_key = blocking(|| fixture.rw_entries(key))[0].clone();
    assert!(writer_key.key.starts_with("dlock-rw/tenant%2F7/write/"));
    assert_eq!(recipe.blocker(&go_reader).await, Some(writer_key.key));
    let waiting = {
        let recipe = go.rw_mutex(&rw_prefix(key));
        let go_reader = go_reader.clone();
        tokio::spawn(async move {
            recipe
                .wait_until_held(&go_reader, Duration::from_secs(5))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a Go reader got in while a dlock writer held"
    );
    let released = Instant::now();
    writer.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the Go reader did not hold after the dlock writer's release")
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
    // A dlock reader shares with the Go reader.
    let reader = rw(&ours, key).try_read().await.unwrap();
    reader.expect("readers share").release().await.unwrap();
    recipe.unlock(&go_reader).await;
}

/// A writer whose `write()` is dropped while it waits, or whose wait runs
/// out, deletes its key: readers that come later are not kept out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_writer_leaves_no_key_behind() {
    let fixture = EtcdFixture::single();
    let key = "cancelled";
    let (a, b, c) = (
        connect(fixture.url()).await,
        connect(fixture.url()).await,
        connect(fixture.url()).await,
    );
    let reader = rw(&a, key).read().await.unwrap();
    let dropped = tokio::time::timeout(Duration::from_millis(500), rw(&b, key).write()).await;
    assert!(
        dropped.is_err(),
        "the writer should still have been waiting"
    );
    let left = wait_for_entries(&fixture, key, 1).await;
    assert!(left[0].key.contains("/read/"), "{left:?}");
    a_late_reader_gets_in_and_the_writer_times_out(
        &rw(&c, key),
        &rw(&b, key),
        "a dropped writer kept a reader out",
    )
    .await;
    let left = wait_for_entries(&fixture, key, 1).await;
    assert!(left[0].key.contains("/read/"), "{left:?}");
    reader.release().await.unwrap();
    assert!(blocking(|| fixture.rw_entries(key)).is_empty());
}

/// The plain lock and the read-write lock of one key are separate objects
/// on etcd: neither blocks the other, neither's keys are under the other's
/// prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_and_a_read_write_lock_of_one_key_never_meet() {
    let fixture = EtcdFixture::single();
    let key = "shared-name";
    let (a, b) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let plain = Lock::new(key)
        .with_backend(a.clone())
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let writer = rw(&b, key).try_write().await.unwrap();
    let writer = writer.expect("a plain lock kept a read-write lock out");
    let plain_keys = blocking(|| fixture.queue(key));
    let rw_keys = blocking(|| fixture.rw_entries(key));
    assert_eq!(plain_keys.len(), 1, "{plain_keys:?}");
    assert_eq!(rw_keys.len(), 1, "{rw_keys:?}");
    assert!(!rw_keys[0].key.starts_with(&queue_prefix(key)));
    assert!(!plain_keys[0].starts_with(&format!("{}/", rw_prefix(key))));
    writer.release().await.unwrap();
    plain.release().await.unwrap();
}
