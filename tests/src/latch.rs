//! The count-down latch suite, for backends that have latches.
//!
//! Backends opt in with [`latch_suite!`](crate::latch_suite) beside their
//! `conformance_suite!`. The fixture is a [`LatchFixture`]: a
//! [`Fixture`] that can also tell what the server keeps for a latch (its
//! state, its subscriptions), where the server can be asked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{CountDownLatch, LockBackend, LockError};

use crate::conformance::{unique_key, Fixture};

mod fixtures;

/// What the latch suite asks of a fixture beside [`Fixture`].
#[async_trait::async_trait]
pub trait LatchFixture: Fixture {
    /// How many subscriptions (or watches) the server holds now for the
    /// wake-ups of the latch `name`; `None` where it cannot be asked.
    async fn latch_subscriptions(&self, name: &str) -> Option<usize>;

    /// What the server keeps of the latch `name` (keys, rows, nodes, ...),
    /// named; empty when nothing.
    async fn latch_state(&self, name: &str) -> Vec<String>;

    /// How long the backend keeps a subscription after its last waiter
    /// (Redis: the subscriber's linger of one second).
    fn subscription_linger(&self) -> Duration {
        Duration::ZERO
    }
}

/// Expands to one `#[tokio::test]` per latch case. The argument is an
/// expression that builds a fresh [`LatchFixture`].
#[macro_export]
macro_rules! latch_suite {
    ($fixture:expr) => {
        $crate::latch_suite!(@cases $fixture;
            set_count_down_and_count,
            set_is_refused_while_live_and_allowed_again_at_zero,
            count_down_never_goes_below_zero,
            bad_input_is_rejected,
            wait_zero_returns_at_once_at_zero,
            wait_zero_is_woken_by_another_client,
            wait_zero_times_out_after_wait,
            duration_max_wait_is_no_limit,
            cancelled_waits_leave_nothing,
            joined_waiters_in_one_task,
            a_thousand_waiters_share_one_subscription,
            latency_of_the_last_count_down,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod latch {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture;
                    $crate::latch::$case(&fixture).await;
                }
            )*
        }
    };
}

fn latch(backend: &Arc<dyn LockBackend>, name: &str) -> CountDownLatch {
    CountDownLatch::new(name).with_backend(backend.clone())
}

/// A generous bound for a wake-up that should take milliseconds.
const WAKE_BOUND: Duration = Duration::from_secs(10);

pub async fn set_count_down_and_count<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-basics");
    let l = latch(&fixture.backend().await, &name);
    assert_eq!(l.count().await.unwrap(), 0, "an unset latch counts 0");
    assert!(l.try_set_count(3).await.unwrap());
    assert_eq!(l.count().await.unwrap(), 3);
    l.count_down().await.unwrap();
    assert_eq!(l.count().await.unwrap(), 2);
    // Another client sees the same count.
    let other = latch(&fixture.backend().await, &name);
    assert_eq!(other.count().await.unwrap(), 2);
    other.count_down().await.unwrap();
    other.count_down().await.unwrap();
    assert_eq!(l.count().await.unwrap(), 0);
    assert!(
        fixture.latch_state(&name).await.is_empty(),
        "a latch at zero keeps nothing on the server: {:?}",
        fixture.latch_state(&name).await
    );
}

pub async fn set_is_refused_while_live_and_allowed_again_at_zero<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-set-again");
    let a = latch(&fixture.backend().await, &name);
    let b = latch(&fixture.backend().await, &name);
    assert!(a.try_set_count(2).await.unwrap());
    assert!(
        !b.try_set_count(7).await.unwrap(),
        "a live count is not replaced"
    );
    assert_eq!(
        a.count().await.unwrap(),
        2,
        "the refused set changed nothing"
    );
    b.count_down().await.unwrap();
    assert!(!a.try_set_count(1).await.unwrap(), "still live at 1");
    b.count_down().await.unwrap();
    assert!(
        b.try_set_count(5).await.unwrap(),
        "a latch at 0 may be set again"
    );
    assert_eq!(a.count().await.unwrap(), 5);
    let big = CountDownLatch::MAX_COUNT;
    for _ in 0..5 {
        a.count_down().await.unwrap();
    }
    assert!(a.try_set_count(big).await.unwrap(), "the largest count");
    assert_eq!(a.count().await.unwrap(), big, "kept exactly");
    a.count_down().await.unwrap();
    assert_eq!(b.count().await.unwrap(), big - 1, "counted down exactly");
}

pub async fn count_down_never_goes_below_zero<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-floor");
    let l = latch(&fixture.backend().await, &name);
    l.count_down().await.unwrap();
    assert_eq!(l.count().await.unwrap(), 0, "unset stays 0");
    assert!(l.try_set_count(1).await.unwrap());
    for _ in 0..3 {
        l.count_down().await.unwrap();
    }
    assert_eq!(l.count().await.unwrap(), 0);
    assert!(
        l.try_set_count(2).await.unwrap(),
        "a latch counted down past zero is at zero, not below"
    );
    assert_eq!(l.count().await.unwrap(), 2);
    // Many clients counting down at once take exactly the count.
    let mut downs = Vec::new();
    for _ in 0..10 {
        let l = latch(&fixture.backend().await, &name);
        downs.push(tokio::spawn(async move { l.count_down().await }));
    }
    for d in downs {
        d.await.unwrap().unwrap();
    }
    assert_eq!(l.count().await.unwrap(), 0);
    assert!(fixture.latch_state(&name).await.is_empty());
}

pub async fn bad_input_is_rejected<F: LatchFixture>(fixture: &F) {
    let backend = fixture.backend().await;
    let name = unique_key("latch-bad-input");
    let l = latch(&backend, &name);
    for count in [0, CountDownLatch::MAX_COUNT + 1, u64::MAX] {
        let e = l.try_set_count(count).await.unwrap_err();
        assert!(
            matches!(e, LockError::InvalidOption { .. })
                && e.to_string().contains(&count.to_string()),
            "count {count}: {e}"
        );
    }
    assert_eq!(l.count().await.unwrap(), 0, "nothing was set");
    for bad in ["", "bad\nname"] {
        let l = latch(&backend, bad);
        let e = l.try_set_count(1).await.unwrap_err();
        assert!(matches!(e, LockError::InvalidKey { .. }), "{bad:?}: {e}");
        let e = l.wait_zero().await.unwrap_err();
        assert!(matches!(e, LockError::InvalidKey { .. }), "{bad:?}: {e}");
    }
    let long = "x".repeat(dlock::MAX_KEY_BYTES + 1);
    let e = latch(&backend, &long).count_down().await.unwrap_err();
    assert!(matches!(e, LockError::InvalidKey { .. }), "{e}");
}

pub async fn wait_zero_returns_at_once_at_zero<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-at-zero");
    let l = latch(&fixture.backend().await, &name).wait(Duration::ZERO);
    let start = Instant::now();
    l.wait_zero().await.expect("an unset latch is at zero");
    l.try_set_count(1).await.unwrap();
    let e = l.wait_zero().await.unwrap_err();
    assert!(matches!(e, LockError::Timeout { .. }), "{e}");
    l.count_down().await.unwrap();
    l.wait_zero().await.expect("counted down to zero");
    assert!(start.elapsed() < WAKE_BOUND);
}

pub async fn wait_zero_is_woken_by_another_client<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-woken");
    let waiter = latch(&fixture.backend().await, &name).wait(Duration::from_secs(30));
    let other = latch(&fixture.backend().await, &name);
    assert!(other.try_set_count(2).await.unwrap());
    let waiting = tokio::spawn(async move { waiter.wait_zero().await.map(|()| Instant::now()) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    other.count_down().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "woken before zero");
    let last = Instant::now();
    other.count_down().await.unwrap();
    let woke = tokio::time::timeout(WAKE_BOUND, waiting)
        .await
        .expect("the waiter heard zero")
        .unwrap()
        .unwrap();
    eprintln!(
        "latch: last count_down -> waiter returned in {:?}",
        woke.saturating_duration_since(last)
    );
}

pub async fn wait_zero_times_out_after_wait<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-timeout");
    let l = latch(&fixture.backend().await, &name).wait(Duration::from_millis(300));
    l.try_set_count(1).await.unwrap();
    let start = Instant::now();
    let e = l.wait_zero().await.unwrap_err();
    let took = start.elapsed();
    match e {
        LockError::Timeout { key, waited } => {
            assert_eq!(key, name);
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected Timeout, got {other}"),
    }
    assert!(
        took >= Duration::from_millis(300) && took < WAKE_BOUND,
        "{took:?}"
    );
    assert_eq!(
        l.count().await.unwrap(),
        1,
        "a timed-out wait changes nothing"
    );
}

pub async fn duration_max_wait_is_no_limit<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-forever");
    let l = latch(&fixture.backend().await, &name).wait(Duration::MAX);
    l.wait_zero().await.expect("at zero");
    l.try_set_count(1).await.unwrap();
    let waiting = tokio::spawn({
        let l = l.clone();
        async move { l.wait_zero().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    latch(&fixture.backend().await, &name)
        .count_down()
        .await
        .unwrap();
    tokio::time::timeout(WAKE_BOUND, waiting)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
}

pub async fn cancelled_waits_leave_nothing<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-cancel");
    let backend = fixture.backend().await;
    let l = latch(&backend, &name);
    l.try_set_count(1).await.unwrap();
    // Cut at every await the wait may be in: before its first read, during
    // it, while subscribing, while waiting.
    for micros in [0, 50, 200, 500, 1_000, 2_000, 5_000, 20_000, 100_000] {
        let cut = tokio::time::timeout(Duration::from_micros(micros), l.wait_zero()).await;
        assert!(cut.is_err(), "cut after {micros} µs");
    }
    tokio::select! {
        _ = l.wait_zero() => panic!("the latch is not at zero"),
        () = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
    assert_eq!(
        l.count().await.unwrap(),
        1,
        "cancelled waits changed nothing"
    );
    // A later wait still works after all those cancellations.
    let waiting = tokio::spawn({
        let l = l.clone();
        async move { l.wait_zero().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    latch(&fixture.backend().await, &name)
        .count_down()
        .await
        .unwrap();
    tokio::time::timeout(WAKE_BOUND, waiting)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    tokio::time::sleep(fixture.subscription_linger() + Duration::from_millis(500)).await;
    let give_up = Instant::now() + WAKE_BOUND;
    loop {
        let subscriptions = fixture.latch_subscriptions(&name).await;
        let state = fixture.latch_state(&name).await;
        if subscriptions.unwrap_or(0) == 0 && state.is_empty() {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "left behind: {subscriptions:?} subscriptions, state {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn joined_waiters_in_one_task<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-joined");
    let l = latch(&fixture.backend().await, &name).wait(Duration::from_secs(30));
    l.try_set_count(1).await.unwrap();
    let counter = latch(&fixture.backend().await, &name);
    let start = Instant::now();
    let (a, b, c, ()) = tokio::join!(l.wait_zero(), l.wait_zero(), l.wait_zero(), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        counter.count_down().await.unwrap();
    });
    a.unwrap();
    b.unwrap();
    c.unwrap();
    assert!(start.elapsed() < WAKE_BOUND);
}

pub async fn a_thousand_waiters_share_one_subscription<F: LatchFixture>(fixture: &F) {
    let name = unique_key("latch-thousand");
    let backend = fixture.backend().await;
    let l = latch(&backend, &name).wait(Duration::from_secs(60));
    l.try_set_count(1).await.unwrap();
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let l = l.clone();
        waiters.spawn(async move { l.wait_zero().await });
    }
    // Every waiter is past its first read once the server shows the
    // subscription; give them a moment more.
    let give_up = Instant::now() + WAKE_BOUND;
    let mut seen = None;
    while Instant::now() < give_up {
        seen = fixture.latch_subscriptions(&name).await;
        if seen.is_none_or(|n| n > 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let subscriptions = fixture.latch_subscriptions(&name).await;
    eprintln!("latch: 1000 waiters, server subscriptions {subscriptions:?} (first seen {seen:?})");
    if let Some(n) = subscriptions {
        assert_eq!(n, 1, "1000 waiters of one process cost one subscription");
    }
    assert_eq!(waiters.len(), 1000, "nobody returned before zero");
    let last = Instant::now();
    latch(&fixture.backend().await, &name)
        .count_down()
        .await
        .unwrap();
    let mut done = 0;
    while let Some(joined) = tokio::time::timeout(WAKE_BOUND, waiters.join_next())
        .await
        .expect("every waiter returns")
    {
        joined.unwrap().unwrap();
        done += 1;
    }
    assert_eq!(done, 1000);
    eprintln!(
        "latch: 1000 waiters all returned {:?} after the last count_down",
        last.elapsed()
    );
}

pub async fn latency_of_the_last_count_down<F: LatchFixture>(fixture: &F) {
    const ROUNDS: usize = 50;
    let name = unique_key("latch-latency");
    let waiter = latch(&fixture.backend().await, &name).wait(Duration::from_secs(30));
    let counter = latch(&fixture.backend().await, &name);
    let mut took = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        assert!(counter.try_set_count(1).await.unwrap());
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.wait_zero().await.map(|()| Instant::now()) }
        });
        // Let the waiter reach its wait (read, subscribe, read).
        tokio::time::sleep(Duration::from_millis(30)).await;
        let last = Instant::now();
        counter.count_down().await.unwrap();
        let woke = tokio::time::timeout(WAKE_BOUND, waiting)
            .await
            .expect("woken")
            .unwrap()
            .unwrap();
        took.push(woke.saturating_duration_since(last));
    }
    took.sort();
    eprintln!(
        "latch latency over {ROUNDS} rounds (last count_down -> wait_zero returns): p50 {:?}, p90 {:?}, max {:?} (targets: 50 ms p50, 250 ms max)",
        took[ROUNDS / 2],
        took[ROUNDS * 9 / 10],
        took[ROUNDS - 1]
    );
}
