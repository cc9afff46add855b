//! FIFO fairness, and a dropped waiter's queue entry.

use super::*;

/// Ten waiters, each its own client, queue one after another behind a holder
/// and get the lock in exactly that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_first_come_first_served() {
    const WAITERS: usize = 10;
    let fixture = EtcdFixture::single();
    let key = "fair";
    let holder = connect(fixture.url()).await;
    let held = lock(&holder, key).acquire().await.unwrap();
    let waiters = QueuedWaiters::queue(
        &fixture,
        key,
        WAITERS,
        |backend| lock(backend, key).wait(Duration::from_secs(30)),
        Duration::from_millis(10),
    )
    .await;
    held.release().await.unwrap();
    waiters.are_served_in_order().await;
    assert!(
        blocking(|| fixture.queue(key)).is_empty(),
        "entries left behind"
    );
}

/// A waiter whose `acquire` is dropped leaves no entry in the server's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_deletes_its_queue_entry() {
    let fixture = EtcdFixture::single();
    let key = "dropped";
    let (a, b) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let held = lock(&a, key).acquire().await.unwrap();
    let waiter = lock(&b, key);
    let dropped = tokio::time::timeout(Duration::from_millis(500), waiter.acquire()).await;
    assert!(
        dropped.is_err(),
        "the waiter should still have been waiting"
    );
    let holder_only = blocking(|| fixture.queue(key));
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let queue = blocking(|| fixture.queue(key));
        if queue.len() == 1 {
            assert_eq!(queue, holder_only[..1], "the holder's entry must stay");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped waiter's entry stayed: {queue:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
    assert!(blocking(|| fixture.queue(key)).is_empty());
}
