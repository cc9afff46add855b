//! dlock's `Election` and Apache Curator's `LeaderLatch` (in a JVM) in one
//! election under `/dlock-election/<name>`, both ways: each waits while the
//! other leads and is elected once the other leaves; Curator's
//! `getLeader()` shows dlock's value (a proclaimed one too), dlock's
//! `leader()` and `observe()` show Curator's participant id; and the node
//! layout is Curator's (`_c_<uuid>-latch-<seq>`, data = the id).
//!
//! Also the liveness of leader processes paused past their ttl (short of
//! the session timeout) and resumed, or killed (`election_process_suite!`).

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{Election, LockBackend};
use dlock_tests::curator::Curator;
use dlock_tests::election::elected_after_another_leader_resigns;
use dlock_tests::fixtures::zookeeper::ZkFixture;
use futures_util::StreamExt;

/// The JVM starts slowly on a loaded machine.
const STARTUP: Duration = Duration::from_secs(60);
const ANSWER: Duration = Duration::from_secs(20);

async fn election(fixture: &ZkFixture) -> Election {
    let backend: Arc<dyn LockBackend> = Arc::new(
        ZooKeeperBackend::connect(fixture.url())
            .await
            .expect("connect"),
    );
    Election::new("scheduler")
        .with_backend(backend)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(60))
}

async fn ask(curator: &mut Curator, command: &str) -> String {
    curator.send(command).await;
    curator.line(ANSWER).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_latch_and_dlock_take_turns() {
    let fixture = ZkFixture::start().await;
    let path = fixture.election_path("scheduler");
    assert_eq!(path, "/dlock-election/scheduler");
    let election = election(&fixture).await;
    let mut changes = election.observe();
    assert_eq!(changes.next().await, Some(None));

    // dlock leads; Curator's latch waits and sees dlock's value.
    let leadership = election.campaign("node-a").await.unwrap();
    let nodes = fixture.election_participants("scheduler").await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert!(
        nodes[0].starts_with("_c_") && nodes[0].contains("-latch-"),
        "not Curator's protected latch name: {nodes:?}"
    );
    let (data, _) = fixture
        .admin()
        .get_data(&format!("{path}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(data, b"node-a", "the node's data is the participant id");

    // A proclaim before the latch starts: Curator reads the new id. (Not
    // while a latch waits right behind: Curator's watch on its predecessor
    // fires on the data change, and Curator ignores all but a delete; the
    // interop guide says so.)
    leadership.proclaim("node-a:9090").await.unwrap();
    let mut curator =
        Curator::leader_latch(&fixture.connect_string(), &path, "node-b", STARTUP).await;
    assert_eq!(ask(&mut curator, "leader").await, "LEADER_IS node-a:9090");
    assert_eq!(ask(&mut curator, "await 1000").await, "TIMEOUT");

    // dlock resigns: Curator is elected; dlock sees it.
    let first_term = leadership.term();
    leadership.resign().await.unwrap();
    assert_eq!(ask(&mut curator, "await 10000").await, "LEADER");
    let leader = election.leader().await.unwrap().expect("Curator leads");
    assert_eq!(leader.value, "node-b");
    assert!(leader.term > first_term);
    let mut seen = None;
    for _ in 0..10 {
        let next = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("a change within 10 s")
            .expect("the stream goes on");
        if next.as_ref().is_some_and(|l| l.value == "node-b") {
            seen = next;
            break;
        }
    }
    assert_eq!(
        seen,
        Some(leader.clone()),
        "observe() showed Curator's leader"
    );

    // Curator leads; dlock waits, and is elected once the latch closes.
    let close = async {
        assert_eq!(ask(&mut curator, "leader").await, "LEADER_IS node-b");
        assert_eq!(ask(&mut curator, "close").await, "CLOSED");
    };
    let again = elected_after_another_leader_resigns(&election, "node-a", "Curator", close).await;
    assert!(again.term() > leader.term);
    again.resign().await.unwrap();
    curator.exits_cleanly().await;
}

dlock_tests::election_process_suite!(
    ZkFixture::start().await,
    env!("CARGO_BIN_EXE_election-candidate")
);

/// A participant node `client` creates by hand under the election `path`,
/// in Curator's protected form, as a stale one would be.
async fn participant_node(client: &zookeeper_client::Client, path: &str, id: &str) -> String {
    let options = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let prefix = format!("{path}/_c_00000000-0000-4000-8000-{id:0>12}-latch-");
    let (_, seq) = client
        .create(&prefix, id.as_bytes(), &options)
        .await
        .expect("create a participant node");
    format!("{prefix}{seq}")
}

/// A participant node of the campaigning backend's own session that it no
/// longer uses (as a lost leader's whose delete never landed) is deleted
/// by the next campaign, which is elected at once; one of another session
/// is left alone, and the campaign waits behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_deletes_the_node_its_own_session_left_behind() {
    let fixture = ZkFixture::start().await;
    let path = fixture.election_path("stale");
    let zk = Arc::new(
        ZooKeeperBackend::connect(fixture.url())
            .await
            .expect("connect"),
    );
    let own_session = zk.client().expect("a session");
    own_session
        .mkdir(
            &path,
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .expect("mkdir");
    let stale = participant_node(&own_session, &path, "5ea1").await;
    let backend: Arc<dyn LockBackend> = zk.clone();
    let election = Election::new("stale")
        .with_backend(backend)
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(10));
    let started = std::time::Instant::now();
    let leadership = election.campaign("node-a").await.expect("elected");
    eprintln!(
        "elected {:?} after a campaign that found its own stale node",
        started.elapsed()
    );
    assert!(
        !fixture
            .election_participants("stale")
            .await
            .iter()
            .any(|n| stale.ends_with(n.as_str())),
        "the stale node is still there"
    );
    leadership.resign().await.unwrap();

    // Another session's node (a live participant elsewhere) stays.
    let other = fixture.admin();
    let foreign = participant_node(&other, &path, "f0e1").await;
    let once = election.clone().wait(Duration::ZERO);
    assert!(
        matches!(
            once.campaign("node-a").await,
            Err(dlock::LockError::Busy { .. })
        ),
        "elected ahead of another session's participant"
    );
    assert!(
        fixture
            .election_participants("stale")
            .await
            .iter()
            .any(|n| foreign.ends_with(n.as_str())),
        "another session's participant was deleted"
    );
    other.delete(&foreign, None).await.unwrap();
}
