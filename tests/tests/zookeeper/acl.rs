//! Permissions: a chroot, digest auth, open directories tightened, the `acl` option.

use super::*;

/// A chroot in the URL roots every lock node under it; a chroot that does not
/// exist is a `Backend` error that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chroot_roots_the_lock_nodes_and_must_exist() {
    let fixture = ZkFixture::start().await;
    let base = fixture.url().split('?').next().unwrap().to_owned();
    let admin = fixture.admin();
    admin
        .create(
            "/app",
            b"",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let rooted = Arc::new(
        ZooKeeperBackend::connect(&format!("{base}/app"))
            .await
            .unwrap(),
    );
    let guard = lock(&rooted, "job").acquire().await.unwrap();
    let children = admin.list_children("/app/dlock/job").await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    guard.release().await.unwrap();

    let missing = Arc::new(
        ZooKeeperBackend::connect(&format!("{base}/nowhere"))
            .await
            .unwrap(),
    );
    for err in [
        lock(&missing, "job")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap_err(),
        lock(&missing, "job").try_acquire().await.unwrap_err(),
    ] {
        assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
        assert!(err.to_string().contains("chroot does not exist"), "{err}");
    }
}

/// With digest credentials in the URL, the directories and nodes dlock
/// creates are writable only by that identity and readable by anyone: a
/// client without the credentials can list the queue and read the holder's
/// node, but cannot queue, delete or change it; a client with the same
/// credentials contends normally. The password never shows in `describe()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_protects_the_lock_namespace() {
    let fixture = ZkFixture::start().await;
    let url = fixture.url().replacen("zk://", "zk://locker:s3cret@", 1);
    let authed = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    assert!(
        !authed.describe().contains("s3cret"),
        "{}",
        authed.describe()
    );
    let guard = lock(&authed, "guarded").acquire().await.unwrap();
    let children = fixture.contenders("guarded").await;
    assert_eq!(children.len(), 1);
    let node = format!("{}/{}", fixture.lock_path("guarded"), children[0]);

    let admin = fixture.admin();
    admin
        .get_data(&node)
        .await
        .expect("anyone may read a lock node");
    assert_eq!(
        admin.delete(&node, None).await,
        Err(zookeeper_client::Error::NoAuth)
    );
    assert_eq!(
        admin.set_data(&node, b"mine now", None).await.unwrap_err(),
        zookeeper_client::Error::NoAuth
    );
    let stranger = backend(&fixture).await;
    let err = lock(&stranger, "guarded").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");

    let colleague = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    assert!(lock(&colleague, "guarded")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let next = lock(&colleague, "guarded")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    next.release().await.unwrap();
}

/// A raw session without credentials: the anonymous client of the ACL tests.
async fn anonymous(fixture: &ZkFixture) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(&fixture.connect_string())
        .await
        .expect("an anonymous session")
}

/// A dlock backend on the fixture's server with `prefix` and, if given,
/// credentials and options.
async fn backend_with(
    fixture: &ZkFixture,
    credentials: Option<&str>,
    query: &str,
) -> Arc<ZooKeeperBackend> {
    let userinfo = credentials.map_or(String::new(), |c| format!("{c}@"));
    let url = format!(
        "zk://{userinfo}{}?session_timeout={}ms&{query}",
        fixture.connect_string(),
        SESSION_TIMEOUT.as_millis()
    );
    Arc::new(ZooKeeperBackend::connect(&url).await.unwrap())
}

/// Whether an anonymous dlock client fails to take `key` under `prefix`
/// (busy, or refused by the server): it must never get it.
async fn anonymous_cannot_take(fixture: &ZkFixture, prefix: &str, key: &str) {
    let stranger = backend_with(fixture, None, &format!("prefix={prefix}")).await;
    match lock(&stranger, key).try_acquire().await {
        Ok(None) | Err(LockError::Backend { .. }) => {}
        other => panic!("an anonymous client took {key}: {other:?}"),
    }
}

pub(crate) fn open_acl() -> zookeeper_client::CreateOptions<'static> {
    zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all())
}

/// Whether `acl` lets anyone (`world:anyone`) do more than read.
fn open_to_anyone(acl: &[zookeeper_client::Acl]) -> bool {
    acl.iter().any(|a| {
        a.scheme() == "world"
            && a.id() == "anyone"
            && a.permission() != zookeeper_client::Permission::READ
    })
}

/// `authed` takes the lock `victim` under `prefix`, whose directory an
/// anonymous client made open: while it holds it, the directory is no
/// longer open, its one node cannot be deleted by `anon`, and an anonymous
/// dlock client cannot take the lock. Then it lets go.
async fn victim_is_tightened_while_held(
    fixture: &ZkFixture,
    authed: &Arc<ZooKeeperBackend>,
    anon: &zookeeper_client::Client,
    prefix: &str,
) {
    let dir = format!("/{prefix}/victim");
    let guard = lock(authed, "victim").acquire().await.unwrap();
    let (acl, _) = anon.get_acl(&dir).await.unwrap();
    assert!(!open_to_anyone(&acl), "still open: {acl:?}");
    let children = anon.list_children(&dir).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let node = format!("{dir}/{}", children[0]);
    assert_eq!(
        anon.delete(&node, None).await,
        Err(zookeeper_client::Error::NoAuth)
    );
    anonymous_cannot_take(fixture, prefix, "victim").await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// Issue 31, case 3: an anonymous client pre-creates the prefix and the key
/// directory open to anyone. dlock with credentials tightens the directory
/// before it hands out the lock, so the anonymous client can neither delete
/// the holder's node nor take the lock; a directory dlock's identity may
/// not change is refused with an error naming the node and its ACL (and no
/// password). The read-write lock's and the semaphore's directories alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_directory_made_by_anyone_is_tightened_or_refused() {
    let fixture = ZkFixture::start().await;
    let anon = anonymous(&fixture).await;
    anon.create("/p5", b"", &open_acl()).await.unwrap();
    anon.create("/p5/victim", b"", &open_acl()).await.unwrap();
    let authed = backend_with(&fixture, Some("app:pw-Secret9"), "prefix=p5").await;
    victim_is_tightened_while_held(&fixture, &authed, &anon, "p5").await;

    // The read-write lock's and the semaphore's directories alike.
    for dir in [
        "/p5-rw",
        "/p5-rw/victim",
        "/p5-semaphores",
        "/p5-semaphores/victim",
    ] {
        anon.create(dir, b"", &open_acl()).await.unwrap();
    }
    let write = rw_lock(&authed, "victim").write().await.unwrap();
    let backend: Arc<dyn LockBackend> = authed.clone();
    let permit = dlock::Semaphore::new("victim", 2)
        .with_backend(backend)
        .acquire()
        .await
        .unwrap();
    for dir in ["/p5-rw/victim", "/p5-semaphores/victim"] {
        let (acl, _) = anon.get_acl(dir).await.unwrap();
        assert!(!open_to_anyone(&acl), "{dir} still open: {acl:?}");
        let node = anon.list_children(dir).await.unwrap().remove(0);
        assert_eq!(
            anon.delete(&format!("{dir}/{node}"), None).await,
            Err(zookeeper_client::Error::NoAuth),
            "{dir}"
        );
    }
    write.release().await.unwrap();
    permit.release().await.unwrap();

    // Open to anyone but for ADMIN: dlock may not tighten it, so it refuses.
    let no_admin = [zookeeper_client::Acl::new(
        zookeeper_client::Permission::CREATE
            | zookeeper_client::Permission::DELETE
            | zookeeper_client::Permission::READ
            | zookeeper_client::Permission::WRITE,
        zookeeper_client::AuthId::anyone(),
    )];
    anon.create(
        "/p5/stuck",
        b"",
        &zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::new(&no_admin)),
    )
    .await
    .unwrap();
    for err in [
        lock(&authed, "stuck").try_acquire().await.unwrap_err(),
        lock(&authed, "stuck")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap_err(),
    ] {
        let text = err.to_string();
        assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
        assert!(text.contains("/p5/stuck"), "{text}");
        assert!(text.contains("world:anyone:cdrw"), "{text}");
        assert!(!text.contains("Secret9"), "{text}");
    }
    // The refused acquisitions left no node behind.
    eventually(
        "the refused nodes are deleted",
        Duration::from_secs(5),
        || async { anon.list_children("/p5/stuck").await.unwrap().is_empty() },
    )
    .await;
}

/// Issue 31, case 3, the other way in: the key directory (a container)
/// vanishes between two acquisitions, as the server removes idle containers,
/// and an anonymous client creates it again open. The next acquisition
/// tightens it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_vanished_and_came_back_open_is_tightened_again() {
    let fixture = ZkFixture::start().await;
    let authed = backend_with(&fixture, Some("app:pw"), "prefix=p6").await;
    acquire_and_release(&lock(&authed, "victim")).await;
    // What the server's container reaper does to idle directories.
    let owner = zookeeper_client::Client::connector()
        .with_auth("digest", b"app:pw")
        .connect(&fixture.connect_string())
        .await
        .unwrap();
    owner.delete("/p6/victim", None).await.unwrap();
    owner.delete("/p6", None).await.unwrap();
    let anon = anonymous(&fixture).await;
    anon.create("/p6", b"", &open_acl()).await.unwrap();
    anon.create("/p6/victim", b"", &open_acl()).await.unwrap();

    victim_is_tightened_while_held(&fixture, &authed, &anon, "p6").await;
}

/// `?acl=creator`: nobody but the URL's identity may even read: an
/// anonymous client cannot list the queue (nor the prefix, which it had
/// made open itself: dlock tightened it) or read a holder's node, while a
/// colleague with the same credentials contends normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_creator_hides_the_queue_from_everyone_else() {
    let fixture = ZkFixture::start().await;
    // A prefix node someone made open is tightened when dlock creates a key
    // directory under it.
    let anon = anonymous(&fixture).await;
    anon.create("/hidden", b"", &open_acl()).await.unwrap();
    let authed = backend_with(&fixture, Some("app:pw"), "prefix=hidden&acl=creator").await;
    let guard = lock(&authed, "secret").acquire().await.unwrap();
    for dir in ["/hidden", "/hidden/secret"] {
        assert_eq!(
            anon.list_children(dir).await,
            Err(zookeeper_client::Error::NoAuth),
            "{dir}"
        );
    }
    let owner = authed.client().unwrap();
    let children = owner.list_children("/hidden/secret").await.unwrap();
    let node = format!("/hidden/secret/{}", children[0]);
    assert_eq!(
        anon.get_data(&node).await.unwrap_err(),
        zookeeper_client::Error::NoAuth
    );
    anonymous_cannot_take(&fixture, "hidden", "secret").await;
    let colleague = backend_with(&fixture, Some("app:pw"), "prefix=hidden&acl=creator").await;
    assert!(lock(&colleague, "secret")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
    let next = lock(&colleague, "secret").try_acquire().await.unwrap();
    assert!(next.is_some());
}

/// `?acl=open` gives open nodes, credentials or not (documented: anyone may
/// then delete a holder's node); `creator_read` and `creator` without
/// credentials are an `InvalidOption` that says credentials are needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_open_gives_open_nodes_and_the_others_need_credentials() {
    let fixture = ZkFixture::start().await;
    let authed = backend_with(&fixture, Some("app:pw"), "prefix=public&acl=open").await;
    let guard = lock(&authed, "shared").acquire().await.unwrap();
    let anon = anonymous(&fixture).await;
    let children = anon.list_children("/public/shared").await.unwrap();
    let node = format!("/public/shared/{}", children[0]);
    for path in ["/public", "/public/shared", node.as_str()] {
        let (acl, _) = anon.get_acl(path).await.unwrap();
        assert_eq!(acl, *zookeeper_client::Acls::anyone_all(), "{path}");
    }
    anon.delete(&node, None).await.unwrap();
    let lost = guard.lost();
    assert!(tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .is_ok());

    for acl in ["creator_read", "creator"] {
        let url = format!("{}&acl={acl}", fixture.url());
        let err = ZooKeeperBackend::connect(&url).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(err.to_string().contains("need credentials"), "{err}");
    }
}

/// The latches' and a barrier's directories are guarded as a lock's: an
/// anonymous client pre-creates `/<prefix>-latches` and a barrier's
/// directory open to anyone; a count set and a member entered with
/// credentials tighten them, so the anonymous client cannot delete the
/// latch (which would end its count for every waiter) or a member (which
/// would count it out). A latches directory dlock may not change refuses
/// the count, which leaves no node behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_latch_and_barrier_directories_are_tightened_or_refused() {
    let fixture = ZkFixture::start().await;
    let anon = anonymous(&fixture).await;
    for dir in ["/p6-latches", "/p6", "/p6/gate"] {
        anon.create(dir, b"", &open_acl()).await.unwrap();
    }
    let authed = backend_with(&fixture, Some("app:pw-Secret9"), "prefix=p6").await;
    let backend: Arc<dyn LockBackend> = authed.clone();

    let latch = dlock::CountDownLatch::new("victim").with_backend(backend.clone());
    assert!(latch.try_set_count(2).await.unwrap());
    let (acl, _) = anon.get_acl("/p6-latches").await.unwrap();
    assert!(!open_to_anyone(&acl), "/p6-latches still open: {acl:?}");
    assert_eq!(
        anon.delete("/p6-latches/victim", None).await,
        Err(zookeeper_client::Error::NoAuth)
    );
    assert_eq!(latch.count().await.unwrap(), 2);

    let member = dlock::Barrier::new("gate", 1)
        .with_backend(backend.clone())
        .enter()
        .await
        .unwrap();
    let (acl, _) = anon.get_acl("/p6/gate").await.unwrap();
    assert!(!open_to_anyone(&acl), "/p6/gate still open: {acl:?}");
    let children = anon.list_children("/p6/gate").await.unwrap();
    let node = children.iter().find(|c| *c != "ready").expect("our member");
    assert_eq!(
        anon.delete(&format!("/p6/gate/{node}"), None).await,
        Err(zookeeper_client::Error::NoAuth)
    );
    member.leave().await.unwrap();

    // Open to anyone but for ADMIN: dlock may not tighten it, so it refuses.
    let no_admin = [zookeeper_client::Acl::new(
        zookeeper_client::Permission::CREATE
            | zookeeper_client::Permission::DELETE
            | zookeeper_client::Permission::READ
            | zookeeper_client::Permission::WRITE,
        zookeeper_client::AuthId::anyone(),
    )];
    anon.create(
        "/p7-latches",
        b"",
        &zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::new(&no_admin)),
    )
    .await
    .unwrap();
    let stuck = backend_with(&fixture, Some("app:pw-Secret9"), "prefix=p7").await;
    let stuck: Arc<dyn LockBackend> = stuck;
    let err = dlock::CountDownLatch::new("victim")
        .with_backend(stuck)
        .try_set_count(1)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(
        text.contains("/p7-latches") && text.contains("world:anyone:cdrw"),
        "{text}"
    );
    assert!(!text.contains("Secret9"), "{text}");
    assert!(
        anon.list_children("/p7-latches").await.unwrap().is_empty(),
        "the refused count left its node"
    );
}
