//! A holder's node deleted behind its back (as `zkCli delete` or Curator's
//! clean-up would, here by an operator's raw session) is heard at once:
//! the holder's `lost()` fires no later than about when another client is
//! granted the lock, and `ensure()` refuses from then on (issue 65).

use dlock_tests::loss_heard::{lost_relative_to_next_grant, report_worst, watch_lost};

use super::*;

/// How many removals.
const RUNS: usize = 10;

/// One run: A holds `key` (ttl 30 s) for `held_for`, an operator deletes its node, B
/// acquires. Returns when A heard the loss, in ms relative to B's grant
/// (negative: before).
async fn one_run(
    fixture: &ZkFixture,
    a: &Arc<ZooKeeperBackend>,
    b: &Arc<ZooKeeperBackend>,
    key: &str,
    held_for: Duration,
) -> f64 {
    let guard = lock(a, key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .expect("A acquires");
    let heard = watch_lost(&guard);
    tokio::time::sleep(held_for).await;
    let children = fixture.contenders(key).await;
    assert_eq!(children.len(), 1, "one node under {key}: {children:?}");
    let node = format!("{}/{}", fixture.lock_path(key), children[0]);
    fixture
        .admin()
        .delete(&node, None)
        .await
        .expect("the operator deletes the holder's node");
    let next = async {
        lock(b, key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .expect("B acquires once A's node is gone")
    };
    lost_relative_to_next_grant(guard, heard, next, "zookeeper delete").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_is_heard_lost_by_the_time_another_client_gets_it() {
    let fixture = ZkFixture::start().await;
    let a = backend(&fixture).await;
    let b = backend(&fixture).await;
    // Held a while (the watch is set 50 ms after the grant), and deleted
    // right after the grant (seen when the watch is set: up to 50 ms later).
    for (case, held_for) in [("held 200 ms", 200), ("right after the grant", 0)] {
        let mut figures = Vec::with_capacity(RUNS);
        for run in 0..RUNS {
            let key = format!("heard-{held_for}-{run}");
            let ms = one_run(&fixture, &a, &b, &key, Duration::from_millis(held_for)).await;
            eprintln!("zookeeper delete ({case}) run {run}: holder's lost() {ms:+.1} ms after the other client's grant");
            figures.push(ms);
        }
        report_worst(&format!("zookeeper delete ({case})"), &figures);
    }
}
