//! The conformance case of `hold_at_least`: a job that replicas try on a
//! schedule runs once per tick, not once per replica. Every backend runs it
//! through [`conformance_suite!`](crate::conformance_suite).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::conformance::{lock, unique_key, Fixture};

/// Three clients (replicas) try a 20 ms job every 1 s tick, 100 ms out
/// of phase, with `hold_at_least(450 ms)` and a zero wait: the first of a
/// tick runs it and releases at once, yet the key stays taken until 350 ms
/// after its acquisition, so the two later replicas of the tick find it
/// taken and skip; by the next tick it is free again. Exactly one run per
/// tick. Without `hold_at_least` every replica would run every tick. The
/// margins are wide (the last try of a tick 250 ms before the hold ends,
/// the next tick's first 550 ms after): a loaded CI machine delays a
/// deferred release (etcd, ZooKeeper) by hundreds of milliseconds.
pub async fn hold_at_least_runs_once_per_tick<F: Fixture>(fixture: &F) {
    const TICKS: usize = 4;
    const TICK: Duration = Duration::from_millis(1000);
    const PHASE: Duration = Duration::from_millis(100);
    const AT_LEAST: Duration = Duration::from_millis(450);
    let key = unique_key("once-per-tick");
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..TICKS).map(|_| AtomicUsize::new(0)).collect());
    let start = Instant::now() + Duration::from_millis(100);
    let mut replicas = Vec::new();
    for replica in 0..3u32 {
        let backend = fixture.backend().await;
        let job = lock(&backend, &key)
            .wait(Duration::ZERO)
            .hold_at_least(AT_LEAST);
        let runs = runs.clone();
        replicas.push(tokio::spawn(async move {
            for tick in 0..TICKS {
                let at = start + TICK * tick as u32 + PHASE * replica;
                tokio::time::sleep_until(at.into()).await;
                if let Some(guard) = job.try_acquire().await.expect("a replica's try") {
                    runs[tick].fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    guard.release().await.expect("a replica's release");
                }
            }
        }));
    }
    tokio::time::timeout(TICK * (TICKS as u32 + 10), async {
        for replica in replicas {
            replica.await.expect("a replica panicked");
        }
    })
    .await
    .expect("the replicas did not finish");
    let per_tick: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    eprintln!("hold_at_least: runs per tick {per_tick:?}");
    assert_eq!(per_tick, vec![1; TICKS], "runs per tick");
}
