//! A job that several replicas try on the same schedule, run once per tick
//! in the whole fleet: `hold_at_least` keeps the key taken for most of the
//! tick, so the replicas whose tick comes a little later skip it.
//!
//! Three replicas (three clients of the lock service, as three processes
//! would be) tick every 2 s, 300 ms out of phase; the job takes 100 ms.
//! Without `hold_at_least` every replica runs it every tick.
//!
//! ```sh
//! cargo run -p dlock-examples --example scheduled_job
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-examples --example scheduled_job
//! ```
//!
//! With the attribute, the same job is
//! `#[distributed_lock(key = "job:invoices", wait = "0s", hold_at_least = "1500ms")]`
//! (one backend per process, the registry's default).

use std::time::Duration;

use dlock::{Lock, LockError};
use tokio::time::{interval_at, Instant};

const REPLICAS: u32 = 3;
const TICKS: usize = 4;
const TICK: Duration = Duration::from_secs(2);
const PHASE: Duration = Duration::from_millis(300);
const JOB: Duration = Duration::from_millis(100);
/// Longer than the replicas are out of phase, shorter than the tick.
const AT_LEAST: Duration = Duration::from_millis(1500);

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://".into());
    let first_tick = Instant::now() + Duration::from_millis(200);
    let mut replicas = Vec::new();
    for replica in 0..REPLICAS {
        // memory:// is one process's lock table: share it; a server URL
        // gets one client per replica, as separate processes would.
        let backend = if url.starts_with("memory") && replica > 0 {
            dlock::registry().default_backend()?
        } else {
            dlock::connect(&url).await?
        };
        if replica == 0 {
            dlock::registry().set_default(backend.clone());
        }
        // No waiting: a replica that finds the key taken skips the tick.
        let job = Lock::new("job:invoices")
            .with_backend(backend)
            .wait(Duration::ZERO)
            .hold_at_least(AT_LEAST);
        let schedule = first_tick + PHASE * replica;
        replicas.push(tokio::spawn(replica_runs(replica, job, schedule)));
    }
    // How many replicas ran the job in each tick: one, if the lock did its work.
    let mut per_tick = vec![0; TICKS];
    for replica in replicas {
        for tick in replica.await.expect("a replica panicked")? {
            per_tick[tick] += 1;
        }
    }
    println!("runs per tick: {per_tick:?}");
    assert_eq!(
        per_tick,
        vec![1; TICKS],
        "the job ran more than once in a tick"
    );
    Ok(())
}

/// One replica: every `TICK` from `first`, it tries the job's lock and runs
/// the job if it got it. Returns the ticks it ran the job in.
async fn replica_runs(replica: u32, job: Lock, first: Instant) -> Result<Vec<usize>, LockError> {
    let mut schedule = interval_at(first, TICK);
    let mut ran = Vec::new();
    for tick in 0..TICKS {
        schedule.tick().await;
        match job.try_acquire().await? {
            Some(guard) => {
                println!("tick {tick}: replica {replica} runs the job");
                tokio::time::sleep(JOB).await; // the job itself
                guard.release().await?;
                ran.push(tick);
            }
            None => println!("tick {tick}: replica {replica} skips (done this tick)"),
        }
    }
    Ok(ran)
}
