//! dlock's `Barrier` and Apache Curator's `DistributedDoubleBarrier` (in a
//! JVM) as members of one double barrier at `/<prefix>/<name>`: two dlock
//! members and one Curator member enter and leave together, with Curator
//! first and with Curator last, twice on one name (the `ready` node is
//! cleared between rounds); the layout is Curator's (one node per member,
//! named by a uuid, and `ready`). A member whose session ends (the JVM
//! killed) is counted out within the session timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{Barrier, BarrierMember, LockBackend, LockError};
use dlock_tests::curator::Curator;
use dlock_tests::fixtures::zookeeper::ZkFixture;

/// The JVM starts slowly on a loaded machine.
const STARTUP: Duration = Duration::from_secs(60);
const ANSWER: Duration = Duration::from_secs(30);

async fn member_barrier(fixture: &ZkFixture, name: &str, parties: usize) -> Barrier {
    let backend: Arc<dyn LockBackend> = Arc::new(
        ZooKeeperBackend::connect(fixture.url())
            .await
            .expect("connect"),
    );
    Barrier::new(name, parties)
        .with_backend(backend)
        .wait(Duration::from_secs(60))
}

async fn enter(b: Barrier) -> Result<BarrierMember, LockError> {
    b.enter().await
}

/// Whether Curator printed nothing within `quiet` (it is still waiting).
async fn still_waiting(curator: &mut Curator, quiet: Duration) -> bool {
    tokio::time::timeout(quiet, curator.line(ANSWER))
        .await
        .is_err()
}

async fn barrier_children(fixture: &ZkFixture, path: &str) -> Vec<String> {
    let admin = fixture.admin();
    admin.sync(path).await.expect("sync");
    let mut children = admin.list_children(path).await.unwrap_or_default();
    children.sort();
    children
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_curator_members_enter_and_leave_together() {
    let fixture = ZkFixture::start().await;
    let name = "batch-7";
    let (a, b) = (
        member_barrier(&fixture, name, 3).await,
        member_barrier(&fixture, name, 3).await,
    );
    let path = fixture.lock_path(name);
    assert_eq!(path, "/dlock/batch-7");
    let mut curator = Curator::double_barrier(&fixture.connect_string(), &path, 3, STARTUP).await;

    // Round 1: dlock's two members first, Curator's arrival opens it.
    let early = tokio::spawn(async move { tokio::join!(enter(a), enter(b)) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!early.is_finished(), "dlock passed with 2 of 3 parties in");
    let members = barrier_children(&fixture, &path).await;
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(
        members
            .iter()
            .all(|m| m.len() == 36 && m.matches('-').count() == 4),
        "members are not named by uuids as Curator's: {members:?}"
    );
    curator.send("enter 30000").await;
    assert_eq!(curator.line(ANSWER).await, "ENTERED");
    let (a, b) = tokio::time::timeout(ANSWER, early)
        .await
        .expect("dlock passes once Curator entered")
        .unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    let nodes = barrier_children(&fixture, &path).await;
    assert_eq!(nodes.len(), 4, "3 members and ready: {nodes:?}");
    assert!(nodes.contains(&"ready".to_owned()), "{nodes:?}");

    // Curator leaves first and waits for dlock's two.
    curator.send("leave 30000").await;
    assert!(
        still_waiting(&mut curator, Duration::from_millis(700)).await,
        "Curator left the barrier with dlock's members in"
    );
    let (la, lb) = tokio::join!(a.leave(), b.leave());
    la.unwrap();
    lb.unwrap();
    assert_eq!(curator.line(ANSWER).await, "LEFT");
    let nodes = barrier_children(&fixture, &path).await;
    assert!(nodes.is_empty(), "members or ready left behind: {nodes:?}");

    // Round 2 on the same name: Curator first, dlock's members open it.
    curator.send("enter 30000").await;
    assert!(
        still_waiting(&mut curator, Duration::from_millis(700)).await,
        "Curator passed alone: the barrier stayed open"
    );
    let (a, b) = (
        member_barrier(&fixture, name, 3).await,
        member_barrier(&fixture, name, 3).await,
    );
    let (a, b) = tokio::join!(enter(a), enter(b));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(curator.line(ANSWER).await, "ENTERED");

    // dlock leaves first and waits for Curator.
    let leaving = tokio::spawn(async move { tokio::join!(a.leave(), b.leave()) });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !leaving.is_finished(),
        "dlock left the barrier with Curator's member in"
    );
    curator.send("leave 30000").await;
    assert_eq!(curator.line(ANSWER).await, "LEFT");
    let (la, lb) = tokio::time::timeout(ANSWER, leaving)
        .await
        .expect("dlock's leave ends once Curator left")
        .unwrap();
    la.unwrap();
    lb.unwrap();
    let nodes = barrier_children(&fixture, &path).await;
    assert!(nodes.is_empty(), "members or ready left behind: {nodes:?}");
    curator.exits_cleanly().await;
}

/// A Curator member killed after entering (its JVM gone, so its session
/// expires) is counted out: dlock's member leaves within the session
/// timeout Curator asked for (10 s), not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_session_ends_is_counted_out() {
    let fixture = ZkFixture::start().await;
    let name = "crash";
    let path = fixture.lock_path(name);
    let mut curator = Curator::double_barrier(&fixture.connect_string(), &path, 2, STARTUP).await;
    let dlock = member_barrier(&fixture, name, 2).await;
    curator.send("enter 30000").await;
    let member = dlock.enter().await.expect("dlock and Curator open it");
    assert_eq!(curator.line(ANSWER).await, "ENTERED");
    let killed = Instant::now();
    drop(curator); // kills the JVM: its session ends on the server's clock
    member
        .leave()
        .await
        .expect("leave goes on once the dead member's session ended");
    let took = killed.elapsed();
    eprintln!(
        "barrier: a killed Curator member was counted out after {took:?} (session timeout 10 s)"
    );
    assert!(took < Duration::from_secs(40), "took {took:?}");
}
