//! The node layout: Curator's, escaped keys, interop with Curator's `InterProcessMutex`, nested prefixes and keys beyond U+FFFF.

use super::*;
use crate::acl::open_acl;

/// Nodes have Curator's protected layout, the key is escaped into one node
/// name, and the fencing token is the node's czxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_use_the_curator_layout_and_escaped_keys() {
    let fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    let key = "tenant/7:order%42";
    assert_eq!(b.lock_path(key).unwrap(), "/dlock/tenant%2F7:order%2542");
    let guard = lock(&b, key).acquire().await.unwrap();
    let children = fixture.contenders(key).await;
    assert_eq!(children.len(), 1, "{children:?}");
    let name = &children[0];
    // _c_<36-char uuid>-lock-<10 digits>
    assert!(name.starts_with("_c_"), "{name}");
    let (uuid, seq) = name[3..].split_once("-lock-").expect("Curator's lock name");
    assert_eq!(uuid.len(), 36, "{name}");
    assert_eq!(seq.len(), 10, "{name}");
    let (_, stat) = fixture
        .admin()
        .get_data(&format!("{}/{name}", fixture.lock_path(key)))
        .await
        .unwrap();
    assert_eq!(guard.fencing_token(), Some(stat.czxid as u64));
    assert!(stat.ephemeral_owner != 0, "the lock node must be ephemeral");
    // try_acquire goes the same way and leaves nothing when it loses.
    let other = backend(&fixture).await;
    assert!(lock(&other, key).try_acquire().await.unwrap().is_none());
    assert_eq!(fixture.contenders(key).await.len(), 1);
    guard.release().await.unwrap();
    assert!(fixture.contenders(key).await.is_empty());
}

/// Curator's `InterProcessMutex` and dlock exclude each other on the same
/// path, both ways, because both queue `_c_<uuid>-lock-<seq>` children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_interprocess_mutex_and_dlock_exclude_each_other() {
    let fixture = ZkFixture::start().await;
    let key = "interop";
    let path = fixture.lock_path(key);
    let connect = fixture.connect_string();
    let b = backend(&fixture).await;
    let startup = Duration::from_secs(30);

    // Curator holds; dlock waits until Curator releases.
    let mut curator = Curator::mutex(&connect, &path, "hold", 1500);
    assert_eq!(curator.line(startup).await, "ACQUIRED");
    let curator_got_it = Instant::now();
    assert!(
        lock(&b, key).try_acquire().await.unwrap().is_none(),
        "dlock took a lock Curator holds"
    );
    let guard = lock(&b, key)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("dlock never got the lock after Curator released it");
    assert!(
        curator_got_it.elapsed() >= Duration::from_millis(1200),
        "dlock got the lock {:?} after Curator took it for 1.5 s",
        curator_got_it.elapsed()
    );
    assert_eq!(curator.line(Duration::from_secs(5)).await, "RELEASED");
    curator.exits_cleanly().await;

    // dlock holds; Curator cannot get it, then waits and gets it on release.
    let mut short = Curator::mutex(&connect, &path, "try", 1000);
    assert_eq!(
        short.line(startup).await,
        "TIMEOUT",
        "Curator took a lock dlock holds"
    );
    short.exits_cleanly().await;
    let mut waiting = Curator::mutex(&connect, &path, "try", 20_000);
    eventually("Curator queued", startup, || async {
        fixture.contenders(key).await.len() == 2
    })
    .await;
    guard.release().await.unwrap();
    assert_eq!(waiting.line(Duration::from_secs(10)).await, "ACQUIRED");
    assert_eq!(waiting.line(Duration::from_secs(10)).await, "RELEASED");
    waiting.exits_cleanly().await;
}

// ------------------------------------------------------- sessions and faults

/// Issue 31, case 6 (ZooKeeper): with `zk://h/app?prefix=x`, the key
/// directory of `Lock("lock-0")` is `/app/x/lock-0`, a child of the
/// directory where `zk://h?prefix=app` queues `Lock("x")`. It is no lock
/// node (not `_c_<uuid>-lock-<10 digits>`), so it must not block `x`; the
/// same for a read-write lock and a key directory named like a write node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_prefixs_key_directory_is_no_contender() {
    let fixture = ZkFixture::start().await;
    let admin = fixture.admin();
    for chroot in ["/app", "/app-rw"] {
        admin.create(chroot, b"", &open_acl()).await.unwrap();
    }
    let at = |chroot: &str, prefix: &str| {
        format!(
            "zk://{}{chroot}?prefix={prefix}&session_timeout={}ms",
            fixture.connect_string(),
            SESSION_TIMEOUT.as_millis()
        )
    };
    let nested = Arc::new(ZooKeeperBackend::connect(&at("/app", "x")).await.unwrap());
    let nested_rw = Arc::new(
        ZooKeeperBackend::connect(&at("/app-rw", "x"))
            .await
            .unwrap(),
    );
    let outer = Arc::new(ZooKeeperBackend::connect(&at("", "app")).await.unwrap());

    let inner = lock(&nested, "lock-0").acquire().await.unwrap();
    let inner_rw = lock(&nested_rw, "__WRIT__0000000000")
        .acquire()
        .await
        .unwrap();
    let children = admin.list_children("/app/x").await.unwrap();
    assert_eq!(children, ["lock-0"]);

    let x = lock(&outer, "x").try_acquire().await.unwrap();
    assert!(
        x.is_some(),
        "Lock(\"x\") is blocked by the directory /app/x/lock-0"
    );
    let read = rw_lock(&outer, "x").try_read().await.unwrap();
    assert!(
        read.is_some(),
        "RwLock(\"x\") is blocked by /app-rw/x/__WRIT__0000000000"
    );
    drop((x, read));
    inner.release().await.unwrap();
    inner_rw.release().await.unwrap();
}

/// Issue 31, case 7: a key with characters above U+FFFF (which the Java
/// server would see as surrogates, and refuse) is escaped per UTF-8 byte,
/// and works for locks, read-write locks and semaphores alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_above_u_ffff_work_for_locks_rw_locks_and_semaphores() {
    let fixture = ZkFixture::start().await;
    let (a, b) = (backend(&fixture).await, backend(&fixture).await);
    let key = "user:😀/𝄞";
    assert_eq!(
        a.lock_path(key).unwrap(),
        "/dlock/user:%F0%9F%98%80%2F%F0%9D%84%9E"
    );
    let guard = lock(&a, key).acquire().await.unwrap();
    assert_eq!(fixture.contenders(key).await.len(), 1);
    assert!(lock(&b, key).try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();

    let write = rw_lock(&a, key).write().await.unwrap();
    assert_eq!(fixture.rw_contenders(key).await.len(), 1);
    assert!(rw_lock(&b, key).try_read().await.unwrap().is_none());
    write.release().await.unwrap();
    let read = rw_lock(&a, key).read().await.unwrap();
    let read_b = rw_lock(&b, key)
        .try_read()
        .await
        .unwrap()
        .expect("readers share");
    read.release().await.unwrap();
    read_b.release().await.unwrap();

    let backend_a: Arc<dyn LockBackend> = a.clone();
    let backend_b: Arc<dyn LockBackend> = b.clone();
    let permit = dlock::Semaphore::new(key, 1)
        .with_backend(backend_a)
        .acquire()
        .await
        .unwrap();
    assert_eq!(fixture.permit_contenders(key).await.len(), 1);
    let second = dlock::Semaphore::new(key, 1)
        .with_backend(backend_b)
        .try_acquire()
        .await
        .unwrap();
    assert!(second.is_none());
    permit.release().await.unwrap();
}
