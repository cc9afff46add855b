//! dlock's `Election` and Apache Curator's `LeaderLatch` (in a JVM) in one
//! election under `/dlock-election/<name>`, both ways: each waits while the
//! other leads and is elected once the other leaves; Curator's
//! `getLeader()` shows dlock's value (a proclaimed one too), dlock's
//! `leader()` and `observe()` show Curator's participant id; and the node
//! layout is Curator's (`_c_<uuid>-latch-<seq>`, data = the id).

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
