//! The queue: arrival order, the cost of an uncontended cycle, a waiter that gives up.

use super::*;

/// Ten waiters, each on its own session, queue behind a holder one after
/// another and get the lock in exactly that order: each watches only its
/// predecessor, and the smallest sequence goes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_waiters_acquire_in_queue_order() {
    const WAITERS: usize = 10;
    let fixture = ZkFixture::start().await;
    let key = "fairness";
    let holder = backend(&fixture).await;
    let held = lock(&holder, key).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let b = backend(&fixture).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock(&b, key)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("waiter {i}: {e}"));
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        // Waiter i has queued when its node is there: holder + i + 1 nodes.
        eventually("waiter queued", Duration::from_secs(10), || async {
            fixture.contenders(key).await.len() == i + 2
        })
        .await;
    }
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        for t in tasks {
            t.await.expect("a waiter panicked");
        }
    })
    .await
    .expect("the waiters did not all finish within 60 s");
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
    assert!(
        fixture.contenders(key).await.is_empty(),
        "nodes left behind"
    );
}

/// The last request id (`lcxid`) the server processed for `session`, from
/// its `cons` four-letter command: the client numbers each request it sends
/// (heartbeats aside), so the difference between two readings counts the
/// requests sent in between.
fn requests_seen(fixture: &ZkFixture, session: zookeeper_client::SessionId) -> i64 {
    let ZkServers::Single(server) = &fixture.servers else {
        unreachable!("a standalone fixture")
    };
    let cons = tokio::task::block_in_place(|| server.four_letter("cons"))
        .unwrap_or_else(|e| panic!("cons: {e}"));
    let sid = format!("sid=0x{:x},", session.0);
    let line = cons
        .lines()
        .find(|l| l.contains(&sid))
        .unwrap_or_else(|| panic!("no connection of session {sid} in:\n{cons}"));
    let lcxid = line
        .split([',', '(', ')'])
        .find_map(|f| f.strip_prefix("lcxid=0x"))
        .unwrap_or_else(|| panic!("no lcxid in {line}"));
    i64::from_str_radix(lcxid, 16).unwrap_or_else(|e| panic!("lcxid {lcxid} in {line}: {e}"))
}

/// An uncontended `acquire` + `release` sends three requests: the create,
/// one listing of the queue (the fencing token comes from the create's own
/// stat, so no read of the node follows), and the release's delete, with
/// nothing left to delete in the background. The same for the read and the
/// write side of a read-write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_a_create_a_listing_and_a_delete() {
    const CYCLES: i64 = 10;
    let fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    let key = "fast-path";
    let wait = Duration::from_secs(10);
    for take in [Take::Lock, Take::Read, Take::Write] {
        // The first cycle also creates the key's directory.
        let first = take.acquire(&b, key, wait).await.unwrap();
        first.release().await.unwrap();
        let session = b.client().expect("a live session").session_id();
        // Background work of a cycle lands within moments; wait for it
        // before each reading, so it is counted in the cycle that caused it.
        let settle = Duration::from_millis(300);
        tokio::time::sleep(settle).await;
        let before = requests_seen(&fixture, session);
        for _ in 0..CYCLES {
            let guard = take.acquire(&b, key, wait).await.unwrap();
            assert!(guard.fencing_token().is_some());
            guard.release().await.unwrap();
        }
        tokio::time::sleep(settle).await;
        let sent = requests_seen(&fixture, session) - before;
        // Slack of one renewal (a sync and a read), should the watchdog run.
        assert!(
            sent <= 3 * CYCLES + 2,
            "{CYCLES} uncontended {take:?} cycles sent {sent} requests, {:.1} a cycle: more \
             than create, list and delete",
            sent as f64 / CYCLES as f64
        );
        assert!(
            take.nodes(&fixture, key).await.is_empty(),
            "{take:?}: nodes left behind"
        );
    }
}

/// A waiter whose wait runs out has deleted its node by the time `acquire`
/// returns, so it never stands between the holder and the next contender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_leaves_no_node() {
    let fixture = ZkFixture::start().await;
    let key = "timeout-cleanup";
    let (a, b) = (backend(&fixture).await, backend(&fixture).await);
    let held = lock(&a, key).acquire().await.unwrap();
    let err = lock(&b, key)
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert_eq!(
        fixture.contenders(key).await.len(),
        1,
        "the waiter's node is still queued"
    );
    held.release().await.unwrap();
}
