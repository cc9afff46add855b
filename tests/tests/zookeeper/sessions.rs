//! Session expiry: guards lost with their session, waiters that fail at once, acquisitions that start over on a new session, a cancelled annotated fn.

use super::*;

/// Closing the backend's session from a second client with the same session
/// id and password (as Curator's `KillSession` does) expires it: the guard's
/// `lost()` fires, its release says `NotHeld`, and the backend opens a new
/// session for the next acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_loses_every_guard_of_the_session() {
    let fixture = ZkFixture::start().await;
    let (proxy, b) = proxied(&fixture).await;
    let one = lock(&b, "expiry-1")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let two = lock(&b, "expiry-2")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let (lost_one, lost_two) = (one.lost(), two.lost());

    let old_id = b.client().expect("a live session").session_id();
    expire_session(&fixture, &proxy, &b, "expiry-1").await;

    let limit = SESSION_TIMEOUT + Duration::from_secs(3);
    let start = Instant::now();
    tokio::time::timeout(limit, async {
        lost_one.await;
        lost_two.await;
    })
    .await
    .unwrap_or_else(|_| panic!("lost() did not fire within {limit:?} of the session's close"));
    assert!(start.elapsed() < limit);
    assert!(!one.is_held() && !two.is_held());
    assert!(matches!(
        one.release().await,
        Err(LockError::NotHeld { .. })
    ));
    assert!(matches!(
        two.release().await,
        Err(LockError::NotHeld { .. })
    ));
    assert!(
        fixture.contenders("expiry-1").await.is_empty(),
        "the expired session's node survived"
    );

    // A new session serves the next acquisition.
    acquire_on_a_new_session(&b, "expiry-1", old_id, "acquire after the session expired").await;
}

/// A backend that reaches the fixture's standalone server through a fault
/// proxy, so a test can cut it off.
async fn proxied(fixture: &ZkFixture) -> (FaultProxy, Arc<ZooKeeperBackend>) {
    let ZkServers::Single(server) = &fixture.servers else {
        unreachable!("a standalone fixture")
    };
    let proxy = FaultProxy::start(server.addr()).await;
    let url = format!(
        "zk://{}?session_timeout={}ms",
        proxy.addr(),
        SESSION_TIMEOUT.as_millis()
    );
    let backend = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    (proxy, backend)
}

/// Expires `backend`'s session the way Curator's `KillSession` does: a second
/// client re-establishes it with the same id and password and closes it. The
/// backend is cut off by its proxy meanwhile (else its reconnects would keep
/// taking the session back), and reconnects after the close, to hear that the
/// session expired. Returns once the server dropped the session's `key` node.
async fn expire_session(
    fixture: &ZkFixture,
    proxy: &FaultProxy,
    backend: &ZooKeeperBackend,
    key: &str,
) {
    expire_session_leaving(fixture, proxy, backend, key, 0).await;
}

/// [`expire_session`], returning once `key` has `left` nodes of other
/// sessions.
async fn expire_session_leaving(
    fixture: &ZkFixture,
    proxy: &FaultProxy,
    backend: &ZooKeeperBackend,
    key: &str,
    left: usize,
) {
    let session = backend.client().expect("a live session").session().clone();
    proxy.reset();
    kill_session(fixture, session).await;
    eventually(
        "the closed session's node is deleted",
        Duration::from_secs(5),
        || async { fixture.contenders(key).await.len() == left },
    )
    .await;
    proxy.pass();
}

/// The next acquisition of `key` on `b`, after its session `old_id` expired:
/// it must succeed (`what` names it in the failure) on a new session.
async fn acquire_on_a_new_session(
    b: &Arc<ZooKeeperBackend>,
    key: &str,
    old_id: zookeeper_client::SessionId,
    what: &str,
) {
    let again = lock(b, key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_ne!(
        b.client().expect("a live session").session_id(),
        old_id,
        "the expired session was reused"
    );
    again.release().await.unwrap();
}

/// Ends `session` on the server the way Curator's `KillSession` does: a
/// second client re-establishes it with the same id and password, and
/// dropping that client's last handle closes it.
async fn kill_session(fixture: &ZkFixture, session: zookeeper_client::SessionInfo) {
    let intruder = zookeeper_client::Client::connector()
        .with_session(session)
        .connect(&fixture.connect_string())
        .await
        .expect("re-establish the session from a second client");
    intruder
        .check_stat("/")
        .await
        .expect("the intruder owns the session");
    drop(intruder);
}

/// A waiter whose session expires while it waits fails with a backend error
/// as soon as it hears of the expiry, instead of waiting out its deadline;
/// its node went with the session, the holder keeps the lock, and the
/// backend's next acquisition runs on a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_session_expires_fails_without_waiting_out_its_deadline() {
    let fixture = ZkFixture::start().await;
    let key = "expiry-waiting";
    let holder = backend(&fixture).await;
    let held = lock(&holder, key).acquire().await.unwrap();
    let (proxy, b) = proxied(&fixture).await;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { lock(&b, key).wait(Duration::from_secs(60)).acquire().await }
    });
    // Queued and waiting: its node is in the queue and its session watches
    // the node ahead. (Its node alone is not enough: a create whose answer
    // the cut loses leaves an acquisition that has no place yet, and that
    // one starts over on a new session, as the tests below show.)
    let old_id = b.client().expect("a live session").session_id();
    eventually(
        "the waiter queued and watching",
        Duration::from_secs(10),
        || async { fixture.contenders(key).await.len() == 2 && watches_in(&fixture, old_id, key) },
    )
    .await;
    expire_session_leaving(&fixture, &proxy, &b, key, 1).await;

    let limit = SESSION_TIMEOUT + Duration::from_secs(5);
    let got = tokio::time::timeout(limit, waiting)
        .await
        .unwrap_or_else(|_| panic!("the waiter still waited {limit:?} after its session expired"))
        .expect("the waiter panicked");
    match got {
        Err(LockError::Backend { .. }) => {}
        other => panic!("expected a backend error from the expired session, got {other:?}"),
    }
    assert!(held.is_held(), "the holder lost the lock");
    assert_eq!(
        fixture.contenders(key).await.len(),
        1,
        "the expired waiter's node survived"
    );
    held.release().await.unwrap();
    acquire_on_a_new_session(
        &b,
        key,
        old_id,
        "acquire after the waiter's session expired",
    )
    .await;
}

/// Whether the server holds a watch of `session` on a node of `key`'s queue
/// (the `wchc` four-letter word lists watched paths by session).
fn watches_in(fixture: &ZkFixture, session: zookeeper_client::SessionId, key: &str) -> bool {
    let ZkServers::Single(server) = &fixture.servers else {
        unreachable!("a standalone fixture")
    };
    let by_session = tokio::task::block_in_place(|| server.four_letter("wchc"))
        .expect("the server answers wchc");
    let dir = format!("{}/", fixture.lock_path(key));
    let mut ours = false;
    for line in by_session.lines() {
        match line.strip_prefix("0x") {
            Some(id) => ours = u64::from_str_radix(id.trim(), 16).ok() == Some(session.0 as u64),
            None => {
                if ours && line.trim().starts_with(&dir) {
                    return true;
                }
            }
        }
    }
    false
}

/// An acquisition started while the backend is cut off, on a session the
/// server expires meanwhile: the client learns of the expiry only when it
/// reconnects, as the acquisition's first request fails with "session
/// expired". Nothing was queued, so the acquisition starts over on a new
/// session and takes the free key, instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_sent_on_a_session_expired_unknown_to_the_client_starts_over() {
    starts_over_on_a_new_session(Take::Lock).await;
}

/// The same for the write side of a read-write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_on_a_session_expired_unknown_to_the_client_starts_over() {
    starts_over_on_a_new_session(Take::Write).await;
}

/// The same for a semaphore's permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_asked_on_a_session_expired_unknown_to_the_client_starts_over() {
    starts_over_on_a_new_session(Take::Permit).await;
}

async fn starts_over_on_a_new_session(take: Take) {
    let fixture = ZkFixture::start().await;
    let key = "expired-unknowingly";
    let (proxy, b) = proxied(&fixture).await;
    let old_session = b.client().expect("a live session").session().clone();
    let old_id = old_session.id();
    // Cut off: the client reconnects in a loop, its requests wait. The
    // acquisition starts only once the client has noticed, so that none of
    // its requests reaches the server before the session is gone.
    let client = b.client().expect("a live session");
    proxy.reset();
    eventually(
        "the client noticed it is cut off",
        Duration::from_secs(10),
        || {
            let state = client.state();
            async move { state != zookeeper_client::SessionState::SyncConnected }
        },
    )
    .await;
    let acquiring = tokio::spawn({
        let b = b.clone();
        async move { take.acquire(&b, key, Duration::from_secs(20)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The server expires the session meanwhile.
    kill_session(&fixture, old_session).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.pass();
    let guard = tokio::time::timeout(Duration::from_secs(25), acquiring)
        .await
        .expect("the acquisition did not finish")
        .expect("the acquisition panicked")
        .expect("an acquisition that never got a place failed with the expired session");
    assert_ne!(
        b.client().expect("a live session").session_id(),
        old_id,
        "the expired session was used"
    );
    assert_eq!(take.nodes(&fixture, key).await.len(), 1);
    guard.release().await.unwrap();
}

/// A critical section far longer than the test; the session under it expires.
#[distributed_lock(key = "expiring:{id}", ttl = "30s", backend = "zk-session-expiry")]
async fn long_critical_section(
    id: u64,
    started: tokio::sync::oneshot::Sender<()>,
) -> Result<&'static str, LockError> {
    let _ = started.send(());
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok("finished")
}

/// An annotated fn with the default `on_lost = "cancel"` whose session
/// expires mid-body returns `Err(Lost)` at once instead of running on
/// unprotected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_cancels_an_annotated_fn() {
    let fixture = ZkFixture::start().await;
    let (proxy, b) = proxied(&fixture).await;
    dlock::registry().register("zk-session-expiry", b.clone());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let job = tokio::spawn(long_critical_section(1, started_tx));
    tokio::time::timeout(Duration::from_secs(10), started_rx)
        .await
        .expect("the body did not start within 10 s")
        .expect("the body dropped its start signal");
    expire_session(&fixture, &proxy, &b, "expiring:1").await;
    let limit = SESSION_TIMEOUT + Duration::from_secs(3);
    let result = tokio::time::timeout(limit, job)
        .await
        .unwrap_or_else(|_| {
            panic!("the annotated fn ran on for {limit:?} after its session closed")
        })
        .unwrap();
    assert!(
        matches!(result, Err(LockError::Lost { ref key }) if key == "expiring:1"),
        "{result:?}"
    );
}
