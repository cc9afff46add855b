//! A killed holder process, a stopped server, bad URLs, a crashed ensemble leader.

use super::*;

/// A holder process killed with SIGKILL leaves its session to expire on the
/// server: the next waiter gets the lock after about the session timeout, not
/// before and not much later, with a larger fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_the_lock_after_the_session_timeout() {
    let fixture = ZkFixture::start().await;
    let key = "crash";
    let mut holder = Holder::spawn(
        env!("CARGO_BIN_EXE_lock-holder"),
        &HolderSpec::once(
            fixture.url(),
            key,
            Duration::from_secs(30),
            Duration::from_secs(120),
        ),
    );
    let token = holder.acquired(Duration::from_secs(30)).await;
    let fence: u64 = token
        .parse()
        .unwrap_or_else(|_| panic!("unexpected lock-holder token {token:?}"));

    holder.kill9().await;
    let killed_at = Instant::now();
    let b = backend(&fixture).await;
    let guard = lock(&b, key)
        .wait(SESSION_TIMEOUT * 3)
        .acquire()
        .await
        .expect("the crashed holder's lock was never freed");
    let took = killed_at.elapsed();
    assert!(
        took >= SESSION_TIMEOUT / 2,
        "got the lock {took:?} after the kill: the dead holder's session cannot have expired yet"
    );
    assert!(
        took <= SESSION_TIMEOUT + Duration::from_secs(3),
        "got the lock only {took:?} after the kill (session timeout {SESSION_TIMEOUT:?})"
    );
    assert!(guard.fencing_token().unwrap() > fence);
    guard.release().await.unwrap();
}

/// With the server stopped, `acquire` fails with `Backend` within its wait
/// (not `Timeout`: the service did not answer), and so does `try_acquire`;
/// a held guard is lost within its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_a_backend_error_within_the_wait() {
    let mut fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    let ttl = Duration::from_secs(2);
    let held = lock(&b, "held").ttl(ttl).acquire().await.unwrap();
    let lost = held.lost();
    let ZkServers::Single(server) = &mut fixture.servers else {
        unreachable!("a standalone fixture")
    };
    tokio::task::block_in_place(|| server.stop());
    let stopped_at = Instant::now();

    let wait = Duration::from_secs(2);
    let start = Instant::now();
    let err = lock(&b, "other").wait(wait).acquire().await.unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(
        took <= wait + Duration::from_millis(500),
        "returned after {took:?}"
    );
    assert!(err.to_string().contains("unreachable"), "{err}");

    let err = lock(&b, "other").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");

    tokio::time::timeout(ttl + Duration::from_secs(1), lost)
        .await
        .expect("the guard was not lost within its ttl of the server stopping");
    assert!(stopped_at.elapsed() <= ttl + Duration::from_secs(1));
}

/// Bad URLs are `InvalidOption` errors that name the URL without its password.
#[tokio::test]
async fn bad_urls_are_rejected_without_showing_the_password() {
    for url in [
        "zk://",
        "zk://u:hunter2@h:notaport",
        "zk://h:1?session_timeout=soon",
        "zk://h:1?colour=red",
    ] {
        let err = invalid_option(url).await;
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
    // Nobody listens on port 1: a Backend error, quickly.
    let start = Instant::now();
    let err = dlock::connect("zk://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// On a three-node ensemble, a guard survives the crash of the leader: the
/// session moves to a surviving node within its timeout, renewals resume,
/// and the lock still excludes others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_survives_the_leader_crashing_in_an_ensemble() {
    let mut fixture = ZkFixture::ensemble().await;
    // A session (and so a lease, 11/20 of it) long enough that a slow
    // election on a busy 2-core machine is not mistaken for a loss.
    let session = Duration::from_secs(20);
    let lease = session / 20 * 11;
    let base = fixture.url().split('?').next().unwrap().to_owned();
    let url = format!("{base}?session_timeout={}ms", session.as_millis());
    let a = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    let b = backend(&fixture).await;
    assert_eq!(a.session_timeout(), session);
    let guard = lock(&a, "failover").acquire().await.unwrap();
    let lost = guard.lost();
    let ZkServers::Ensemble(ensemble) = &mut fixture.servers else {
        unreachable!("an ensemble fixture")
    };
    tokio::task::block_in_place(|| {
        let leader = ensemble
            .wait_for_leader(Duration::from_secs(10))
            .expect("a leader");
        ensemble.node_mut(leader).kill9();
        ensemble
            .wait_for_leader(Duration::from_secs(20))
            .expect("a new leader among the survivors");
    });
    // Past the local deadline of every renewal sent before the crash: any
    // renewal that failed for good would have been declared lost by now.
    let survived = tokio::time::timeout(lease + Duration::from_secs(1), lost)
        .await
        .is_err();
    assert!(
        survived,
        "the guard was lost although the ensemble kept a quorum"
    );
    assert!(guard.is_held());
    assert!(lock(&b, "failover").try_acquire().await.unwrap().is_none());
    guard.release().await.expect("release after the fail-over");
    let next = lock(&b, "failover")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    next.release().await.unwrap();
}
