//! The conformance case of `hold_at_least`: a job that replicas try on a
//! schedule runs once per hold window, not once per replica. Every backend
//! runs it through [`conformance_suite!`](crate::conformance_suite).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conformance::{lock, unique_key, Fixture};

/// One run of the job: when its `try_acquire` was sent and answered.
#[derive(Clone, Copy, Debug)]
struct Run {
    replica: u32,
    sent: Instant,
    granted: Instant,
}

/// Three clients (replicas) try a 20 ms job every 1 s tick, 100 ms out
/// of phase, with `hold_at_least(450 ms)` and a zero wait: the first of a
/// tick runs it and releases at once, yet the key stays taken until 450 ms
/// after its grant, so the two later replicas of the tick find it taken and
/// skip. Without `hold_at_least` every replica would run every tick.
///
/// The verdict is the promise itself, not the schedule: no grant comes
/// less than `hold_at_least` after the one before it (each grant's time is
/// when its answer arrived, which is after the server granted it, and the
/// hold counts from there). A schedule would depend on the machine's speed:
/// on a loaded machine a replica's try can be answered a second late and
/// land in the next tick (CI once counted `[2, 0, 1, 1]` runs per tick by
/// loop index: a late try counted in the tick it was meant for). Runs are
/// counted per tick by when they were granted, and printed.
pub async fn hold_at_least_runs_once_per_tick<F: Fixture>(fixture: &F) {
    const TICKS: u32 = 4;
    const TICK: Duration = Duration::from_millis(1000);
    const PHASE: Duration = Duration::from_millis(100);
    const AT_LEAST: Duration = Duration::from_millis(450);
    let key = unique_key("once-per-tick");
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
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
                let at = start + TICK * tick + PHASE * replica;
                tokio::time::sleep_until(at.into()).await;
                let sent = Instant::now();
                if let Some(guard) = job.try_acquire().await.expect("a replica's try") {
                    let granted = Instant::now();
                    runs.lock().unwrap().push(Run {
                        replica,
                        sent,
                        granted,
                    });
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    guard.release().await.expect("a replica's release");
                }
            }
        }));
    }
    tokio::time::timeout(TICK * (TICKS + 10), async {
        for replica in replicas {
            replica.await.expect("a replica panicked");
        }
    })
    .await
    .expect("the replicas did not finish");
    let mut runs = runs.lock().unwrap().clone();
    runs.sort_by_key(|r| r.granted);
    let since_start = |at: Instant| at.saturating_duration_since(start);
    let mut per_tick = vec![0usize; TICKS as usize + 10];
    for run in &runs {
        let tick = (since_start(run.granted).as_millis() / TICK.as_millis()) as usize;
        let last = per_tick.len() - 1;
        per_tick[tick.min(last)] += 1;
    }
    per_tick.truncate(TICKS as usize);
    let timeline: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "replica {} sent {:?} granted {:?}",
                r.replica,
                since_start(r.sent),
                since_start(r.granted)
            )
        })
        .collect();
    eprintln!("hold_at_least: runs per tick, by grant time {per_tick:?}; runs: {timeline:#?}");
    for pair in runs.windows(2) {
        let gap = pair[1].granted.saturating_duration_since(pair[0].granted);
        assert!(
            gap >= AT_LEAST,
            "two runs inside one hold window ({gap:?} apart, hold_at_least {AT_LEAST:?}): {timeline:#?}"
        );
    }
    // The job runs at all: each tick's first try finds the key free unless
    // a late try of the tick before holds it (at most every other tick).
    assert!(
        runs.len() >= TICKS as usize / 2,
        "the job ran {} times in {TICKS} ticks: {timeline:#?}",
        runs.len()
    );
}
