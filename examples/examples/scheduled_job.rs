//! A job that several replicas try on the same schedule, run once per tick
//! in the whole fleet: `hold_at_least` keeps the key taken for most of the
//! tick, so the replicas whose tick comes a little later skip it.
//!
//! Three replicas (three clients of the lock service, as three processes
//! would be) tick every 2 s, 300 ms out of phase; the job takes 100 ms.
//! Without `hold_at_least` every replica runs it every tick.
//!
//! Keeping the tick through an outage: a `try_acquire` fails at once with
//! `Backend` while the lock service is unreachable (behind Redis Sentinel,
//! for the seconds a failover takes), and a replica that gave up on that
//! error would lose the tick with the others. So each replica tries again
//! until its tick's deadline (`RETRY_FOR`): the first one through runs the
//! job, the others then find the key taken. For exactly one run per tick,
//! `hold_at_least` must outlast every replica's retries (`AT_LEAST` ≥
//! `RETRY_FOR` + the phase spread), and `RETRY_FOR` must outlast a failover
//! for the tick to survive one (Sentinel: `down-after-milliseconds` + 1-2 s;
//! see the operations guide).
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
/// How long into its tick a replica tries again after a `Backend` error:
/// the last retry of the latest replica still ends within the first run's
/// `AT_LEAST` (900 ms + 2 × 300 ms ≤ 1500 ms).
const RETRY_FOR: Duration = Duration::from_millis(900);
/// The pause between those retries.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

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
        let started = schedule.tick().await;
        match take_within_tick(&job, started + RETRY_FOR).await? {
            Some(guard) => {
                println!("tick {tick}: replica {replica} runs the job");
                tokio::time::sleep(JOB).await; // the job itself
                if let Err(e) = guard.release().await {
                    // The job ran; its key expires by its ttl.
                    eprintln!("tick {tick}: replica {replica}: release failed: {e}");
                }
                ran.push(tick);
            }
            None => println!("tick {tick}: replica {replica} skips (done this tick)"),
        }
    }
    Ok(ran)
}

/// `job.try_acquire()`, tried again after an outage's error (`Backend`: the
/// server unreachable, a failover under way; `Replication`: its replicas
/// did not acknowledge) until `retry_until`. `None`: another replica has it.
async fn take_within_tick(
    job: &Lock,
    retry_until: Instant,
) -> Result<Option<dlock::LockGuard>, LockError> {
    loop {
        match job.try_acquire().await {
            Err(e @ (LockError::Backend { .. } | LockError::Replication { .. }))
                if Instant::now() + RETRY_PAUSE < retry_until =>
            {
                eprintln!("the lock service failed ({e}); trying again within the tick");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            answer => return answer,
        }
    }
}
