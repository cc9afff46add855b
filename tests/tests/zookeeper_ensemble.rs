//! ZooKeeper leases on a three-node ensemble whose follower is cut off from
//! the leader: a lease's local deadline must never outlive the session on the
//! leader, the only server that expires sessions.
//!
//! Each test starts its own ensemble (three JVMs) and pauses members with
//! SIGSTOP; every wait is bounded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::AcquireRequest;
use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::zookeeper::{ZkEnsemble, ZkOptions, ZkServer};

/// Starts a three-node ensemble without stalling the runtime.
async fn ensemble(options: ZkOptions) -> ZkEnsemble {
    tokio::task::spawn_blocking(move || {
        ZkEnsemble::try_start_with(3, options).unwrap_or_else(|e| panic!("{e}"))
    })
    .await
    .expect("starting the ZooKeeper ensemble panicked")
}

/// A follower, and the other two members (the leader first).
fn roles(ensemble: &ZkEnsemble) -> (usize, [usize; 2]) {
    let leader = tokio::task::block_in_place(|| ensemble.wait_for_leader(Duration::from_secs(20)))
        .unwrap_or_else(|e| panic!("{e}"));
    let follower = (0..ensemble.len())
        .find(|&i| i != leader)
        .expect("three members");
    let other = (0..ensemble.len())
        .find(|&i| i != leader && i != follower)
        .expect("three members");
    (follower, [leader, other])
}

/// A backend whose URL names only `nodes`, so its session stays on them.
async fn connect(nodes: &[&ZkServer], session_timeout: Duration) -> Arc<ZooKeeperBackend> {
    let hosts: Vec<String> = nodes.iter().map(|n| n.connect_string()).collect();
    let url = format!(
        "zk://{}?session_timeout={}ms",
        hosts.join(","),
        session_timeout.as_millis()
    );
    Arc::new(
        ZooKeeperBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
    )
}

fn lock(backend: &Arc<ZooKeeperBackend>, key: &str) -> Lock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    Lock::new(key).with_backend(backend)
}

/// A follower whose leader went silent goes on answering reads for up to
/// `syncLimit × tickTime` (here 20 × 500 ms = 10 s) before it gives up on
/// the leader, while the leader, if it still has a quorum, expires the
/// sessions it hears nothing about. A renewal that such a follower answers
/// proves nothing, so renewals sync with the leader first: with the leader
/// and the other follower frozen, the guard of a client on the cut-off
/// follower is lost by its local deadline, instead of being renewed by the
/// follower until it gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_its_leader_renews_nothing() {
    let mut ensemble = ensemble(ZkOptions {
        sync_limit: 20,
        ..ZkOptions::default()
    })
    .await;
    let (follower, others) = roles(&ensemble);
    let session = Duration::from_secs(4);
    let b = connect(&[ensemble.node(follower)], session).await;
    let ttl = Duration::from_secs(4);
    let guard = lock(&b, "cut-off").ttl(ttl).acquire().await.unwrap();
    let lost = guard.lost();
    // Renewals run (every ttl/3 at most) while the ensemble is whole.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(guard.is_held(), "lost while the ensemble was whole");

    tokio::task::block_in_place(|| {
        for i in others {
            ensemble.node_mut(i).pause();
        }
    });
    let cut = Instant::now();
    let limit = ttl + Duration::from_secs(3);
    let fired = tokio::time::timeout(limit, lost).await.is_ok();
    let after = cut.elapsed();
    tokio::task::block_in_place(|| {
        for i in others {
            ensemble.node_mut(i).resume();
        }
    });
    assert!(
        fired,
        "the guard was still held {after:?} after its follower lost the leader (ttl {ttl:?}): \
         renewals answered by a follower without a leader kept it"
    );
    assert!(!guard.is_held());
}

/// The leader learns that a session lives from its followers' ping replies
/// (half a tick apart) and expires it one session timeout after the last one
/// that mentioned it; a request that started a lease may not have been
/// mentioned yet. Here a client sits idle on a follower after opening its
/// session (below `zookeeper-client`'s first heartbeat, at 3/20 of the
/// session timeout), so the leader's last news of the session is its
/// creation; it takes a lock, and at once its follower is frozen, so the
/// leader never hears of that request. The leader expires the session one
/// session timeout after its creation and another client gets the lock:
/// by then the first lease's local deadline must have passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ends_before_the_leader_can_expire_its_session() {
    lease_ends_before_the_session(Take::Try).await;
}

/// The same through `acquire`: an uncontended acquisition is granted by the
/// listing sent behind its create, with no `sync`, and its lease is counted
/// from the create, a write the leader committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquired_lease_ends_before_the_leader_can_expire_its_session() {
    lease_ends_before_the_session(Take::Acquire).await;
}

/// How the first client takes the lock.
#[derive(Debug, Clone, Copy)]
enum Take {
    Try,
    Acquire,
}

async fn lease_ends_before_the_session(take: Take) {
    let mut ensemble = ensemble(ZkOptions::default()).await;
    let (follower, others) = roles(&ensemble);
    let session = Duration::from_secs(40);
    let b = connect(&[ensemble.node(follower)], session).await;
    let opened = Instant::now();
    assert_eq!(b.session_timeout(), session);
    tokio::time::sleep(Duration::from_millis(5500)).await;

    let holder: Arc<dyn LockBackend> = b.clone();
    let request = AcquireRequest {
        key: "stale-touch".into(),
        token: "00112233445566778899aabbccddeeff".into(),
        ttl: session,
    };
    let taken = match take {
        Take::Try => holder.try_acquire(&request).await,
        Take::Acquire => holder.acquire(&request, None).await,
    };
    let lease = taken
        .unwrap_or_else(|e| panic!("{take:?}: {e}"))
        .expect("a free key");
    tokio::task::block_in_place(|| ensemble.node_mut(follower).pause());

    let other = connect(
        &[ensemble.node(others[0]), ensemble.node(others[1])],
        Duration::from_secs(10),
    )
    .await;
    let limit = session + Duration::from_secs(20);
    let got = lock(&other, "stale-touch")
        .wait(limit.saturating_sub(opened.elapsed()))
        .acquire()
        .await;
    let got_at = Instant::now();
    tokio::task::block_in_place(|| ensemble.node_mut(follower).resume());
    let guard = got.unwrap_or_else(|e| {
        panic!(
            "the frozen follower's session was not expired {:?} after it opened: {e}",
            opened.elapsed()
        )
    });
    assert!(
        got_at >= lease.valid_until,
        "another client got the lock {:?} after the session opened, {:?} before the first \
         lease's local deadline (lease ttl {:?}): the deadline outlived the session on the leader",
        got_at - opened,
        lease.valid_until - got_at,
        lease.ttl
    );
    guard.release().await.unwrap();
}
