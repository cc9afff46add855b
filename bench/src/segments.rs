//! One hot key on Redis: a single `Lock` against `SegmentedLock` with 4 and 8
//! segments and a `Semaphore` with 4 permits, in critical sections per second.
//!
//! 64 tasks share one key for a fixed time each. Every critical section does
//! a small fixed amount of work (a 1 ms sleep, as a database round trip
//! would), so it is the lock's exclusivity, not Redis, that bounds the single
//! lock's rate, and splitting the resource can help. Each segment and each
//! permit is checked for overlap (at most one holder per segment, at most 4
//! holders of the semaphore) while it runs.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockError, SegmentedLock, Semaphore};

use super::stats::{print_table, Row};

use super::workloads::BoxError;

const TASKS: usize = 64;
const RUN_FOR: Duration = Duration::from_secs(3);
const WORK: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_secs(30);

/// What the tasks contend for.
#[derive(Clone)]
enum Contended {
    Single(Lock),
    Segmented(SegmentedLock),
    Semaphore(Semaphore),
}

/// Runs the four variants against `url` and prints the table.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let backend: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(url).await?);
    let run_id = std::process::id();
    println!(
        "Hot-key benchmark against {}: {TASKS} tasks, {RUN_FOR:?} per variant, {WORK:?} of work per critical section",
        dlock::url::redact(url)
    );
    let key = |what: &str| format!("bench:{run_id}:hot:{what}");
    let single = Lock::new(key("single"))
        .ttl(TTL)
        .with_backend(backend.clone());
    let seg = |n: usize| {
        SegmentedLock::new(key(&format!("seg{n}")), n)
            .ttl(TTL)
            .with_backend(backend.clone())
    };
    let semaphore = Semaphore::new(key("sem4"), 4)
        .ttl(TTL)
        .with_backend(backend.clone());

    let base = measure(Contended::Single(single), 1).await?;
    let seg4 = measure(Contended::Segmented(seg(4)), 1).await?;
    let seg8 = measure(Contended::Segmented(seg(8)), 1).await?;
    let sem4 = measure(Contended::Semaphore(semaphore), 4).await?;
    let rows = [
        Row::throughput("single Lock", base, base),
        Row::throughput("SegmentedLock, 4 segments", seg4, base),
        Row::throughput("SegmentedLock, 8 segments", seg8, base),
        Row::throughput("Semaphore, 4 permits", sem4, base),
    ];
    print_table(
        "Redis: one hot key, critical sections per second",
        "single Lock",
        &rows,
    );
    println!(
        "\n8 segments reach {:.1}× the single lock (target: at least 4×)",
        seg8 / base
    );
    Ok(())
}

/// Runs `TASKS` tasks on `what` for `RUN_FOR`; returns critical sections
/// per second. `most` is how many holders one slot may have at once (1 per
/// segment; the permit count for a semaphore); more is an error.
async fn measure(what: Contended, most: usize) -> Result<f64, BoxError> {
    let slots = match &what {
        Contended::Segmented(s) => s.segments(),
        _ => 1,
    };
    let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..slots).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + RUN_FOR;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (what, inside, overlaps, done) =
            (what.clone(), inside.clone(), overlaps.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                section(&what, &inside, most, &overlaps).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = start.elapsed();
    let overlaps = overlaps.load(Ordering::SeqCst);
    if overlaps > 0 {
        return Err(format!("{overlaps} critical sections overlapped").into());
    }
    Ok(done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64())
}

/// One critical section: acquire, work, release.
async fn section(
    what: &Contended,
    inside: &[AtomicUsize],
    most: usize,
    overlaps: &AtomicUsize,
) -> Result<(), LockError> {
    let work = |slot: usize| async move {
        if inside[slot].fetch_add(1, Ordering::SeqCst) >= most {
            overlaps.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(WORK).await;
        inside[slot].fetch_sub(1, Ordering::SeqCst);
    };
    match what {
        Contended::Single(lock) => {
            let guard = lock.acquire().await?;
            work(0).await;
            guard.release().await
        }
        Contended::Segmented(lock) => {
            let guard = lock.acquire().await?;
            work(guard.segment().unwrap_or(0)).await;
            guard.release().await
        }
        Contended::Semaphore(semaphore) => {
            let permit = semaphore.acquire().await?;
            work(0).await;
            permit.release().await
        }
    }
}
