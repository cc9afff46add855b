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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockError};

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
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..TICKS).map(|_| AtomicUsize::new(0)).collect());
    let start = Instant::now() + Duration::from_millis(200);
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
        let job = Lock::new("job:invoices")
            .with_backend(backend)
            .wait(Duration::ZERO)
            .hold_at_least(AT_LEAST);
        let runs = runs.clone();
        replicas.push(tokio::spawn(async move {
            for tick in 0..TICKS {
                let at = start + TICK * tick as u32 + PHASE * replica;
                tokio::time::sleep_until(at.into()).await;
                match job.try_acquire().await? {
                    Some(guard) => {
                        println!("tick {tick}: replica {replica} runs the job");
                        runs[tick].fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(JOB).await;
                        guard.release().await?;
                    }
                    None => println!("tick {tick}: replica {replica} skips (done this tick)"),
                }
            }
            Ok::<_, LockError>(())
        }));
    }
    for replica in replicas {
        replica.await.expect("a replica panicked")?;
    }
    let per_tick: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    println!("runs per tick: {per_tick:?}");
    assert_eq!(
        per_tick,
        vec![1; TICKS],
        "the job ran more than once in a tick"
    );
    Ok(())
}
