//! The conformance case for short waits under contention: a wait that runs
//! out is `Timeout` (a zero wait `Busy`), whether or not a request to the
//! server was in flight at that instant; `Backend` is for a failing
//! server, and the server here is healthy. Every backend runs it through
//! [`conformance_suite!`](crate::conformance_suite).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::LockError;

use crate::conformance::{lock, unique_key, Fixture};
use crate::overlap::OverlapDetector;

/// What the contenders of [`short_waits_time_out_never_fail`] got.
#[derive(Default)]
struct Tally {
    acquired: AtomicUsize,
    timeouts: AtomicUsize,
    busy: AtomicUsize,
}

/// 16 tasks on two clients try 15 times each with a 50 ms wait (and every
/// fifth try with a zero wait) against a holder on a third client that
/// takes and gives back the key all the time (holding it 3 ms and
/// 60 ms in turn). Many waits end with the
/// acquire request in flight. Every refusal must be `Timeout` (`Busy` for
/// a zero wait), never `Backend`; no two holders overlap; and no grant
/// answered after its wait ran out is left on the server: once everyone
/// stopped, a fourth client takes the key at once (the contenders' ttl is
/// 30 s, so a left-over grant would show).
pub async fn short_waits_time_out_never_fail<F: Fixture>(fixture: &F) {
    const TASKS: usize = 16;
    const TRIES: usize = 15;
    let key = unique_key("short-waits");
    let detector = Arc::new(OverlapDetector::default());
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));

    let holder_backend = fixture.backend().await;
    let holder = {
        let lock = lock(&holder_backend, &key).wait(Duration::from_secs(10));
        let (detector, stop) = (detector.clone(), stop.clone());
        tokio::spawn(async move {
            // Bounded: the contenders finish in a few seconds.
            for cycle in 0..10_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let guard = lock.acquire().await.expect("the churning holder's acquire");
                detector.enter();
                // Short holds hand the key around (waits end mid-request);
                // long ones outlast a whole wait (waits run out asleep).
                let hold = if cycle % 2 == 0 { 3 } else { 60 };
                tokio::time::sleep(Duration::from_millis(hold)).await;
                detector.leave();
                guard
                    .release()
                    .await
                    .expect("the churning holder's release");
                tokio::task::yield_now().await;
            }
        })
    };

    let clients = [fixture.backend().await, fixture.backend().await];
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let backend = clients[task % clients.len()].clone();
        let (key, detector, tally) = (key.clone(), detector.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            for attempt in 0..TRIES {
                let wait = if attempt % 5 == 4 {
                    Duration::ZERO
                } else {
                    Duration::from_millis(50)
                };
                let lock = lock(&backend, &key).ttl(Duration::from_secs(30)).wait(wait);
                match lock.acquire().await {
                    Ok(guard) => {
                        detector.enter();
                        tokio::task::yield_now().await;
                        detector.leave();
                        tally.acquired.fetch_add(1, Ordering::SeqCst);
                        guard.release().await.expect("a contender's release");
                    }
                    Err(LockError::Timeout { .. }) if !wait.is_zero() => {
                        tally.timeouts.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(LockError::Busy { .. }) if wait.is_zero() => {
                        tally.busy.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => panic!("a {wait:?} wait against a healthy server ended with {e:?}"),
                }
            }
        }));
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        for task in tasks {
            task.await.expect("a contender panicked");
        }
    })
    .await
    .expect("the contenders did not finish within 60 s");
    stop.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(15), holder)
        .await
        .expect("the holder did not stop")
        .expect("the holder panicked");

    let (acquired, timeouts, busy) = (
        tally.acquired.load(Ordering::SeqCst),
        tally.timeouts.load(Ordering::SeqCst),
        tally.busy.load(Ordering::SeqCst),
    );
    eprintln!(
        "short waits: {acquired} acquired, {timeouts} Timeout, {busy} Busy of {}",
        TASKS * TRIES
    );
    assert_eq!(acquired + timeouts + busy, TASKS * TRIES);
    assert!(timeouts > 0, "no wait ran out: the holder did not contend");
    assert_eq!(detector.overlaps(), 0, "two holders overlapped");

    // A grant cut off at its deadline is given back in the background: a
    // bounded moment, far below the contenders' 30 s ttl.
    let fresh = fixture.backend().await;
    let start = Instant::now();
    let guard = lock(&fresh, &key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("a grant answered after its wait ran out was left on the server");
    eprintln!(
        "short waits: the key was free again after {:?}",
        start.elapsed()
    );
    guard.release().await.unwrap();
}
