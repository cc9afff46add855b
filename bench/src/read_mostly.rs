//! A read-mostly key: `RwLock` against a plain `Lock`, on any backend with
//! read-write locks (`--read-mostly`; Redis, Redis Cluster, etcd, ZooKeeper,
//! memory).
//!
//! 64 tasks share one key for a fixed time per variant. Each critical
//! section is a read 95 % of the time and a write otherwise, and does 1 ms
//! of work (a sleep, as a database round trip would). With a plain `Lock`
//! every section is exclusive, so the lock bounds the rate near 1 000 per
//! second whatever the server; with an `RwLock` readers share and the rate
//! is bounded by the writers and by the server. Every section is checked
//! for overlap while it runs (a writer alone; readers never beside a
//! writer): a variant that overlaps fails the run.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError, LockGuard, RwLock};

use super::stats::{fmt_duration, print_table, Row, Summary};
use super::workloads::BoxError;

const TASKS: usize = 64;
const READS_IN_100: u64 = 95;
const RUN_FOR: Duration = Duration::from_secs(5);
const WORK: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_secs(30);
/// A writer adds this to the count of holders inside; a reader adds one.
const WRITER: usize = 1 << 20;

/// What the tasks contend for.
#[derive(Clone)]
enum Contended {
    Plain(Lock),
    Rw(RwLock),
}

/// One variant's figures.
struct Measured {
    sections: f64,
    reads: u64,
    writes: u64,
    read_waits: Vec<Duration>,
    write_waits: Vec<Duration>,
}

/// Runs both variants against `url` and prints the table.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let backend: Arc<dyn LockBackend> = dlock::connect(url).await?;
    let run_id = std::process::id();
    println!(
        "Read-mostly benchmark against {}: {TASKS} tasks, {READS_IN_100} % reads, {RUN_FOR:?} per variant, {WORK:?} of work per critical section",
        dlock::url::redact(url)
    );
    let key = |what: &str| format!("bench:{run_id}:read-mostly:{what}");
    let plain = Lock::new(key("lock"))
        .ttl(TTL)
        .with_backend(backend.clone());
    let rw = RwLock::new(key("rw"))
        .ttl(TTL)
        .with_backend(backend.clone());

    let base = measure(Contended::Plain(plain)).await?;
    let ours = measure(Contended::Rw(rw)).await?;
    let mut rows = vec![
        Row::throughput("plain Lock, sections/s", base.sections, base.sections),
        Row::throughput("RwLock, sections/s", ours.sections, base.sections),
    ];
    for (what, waits_ours, waits_base) in [
        ("read wait p50", &ours.read_waits, &base.read_waits),
        ("write wait p50", &ours.write_waits, &base.write_waits),
    ] {
        let (Some(o), Some(b)) = (
            Summary::of(&mut waits_ours.clone()),
            Summary::of(&mut waits_base.clone()),
        ) else {
            continue;
        };
        rows.push(Row::latency(what, o.p50, b.p50));
        rows.push(Row::latency(&what.replace("p50", "p99"), o.p99, b.p99));
    }
    print_table(
        "Read-mostly key: RwLock against a plain Lock",
        "plain Lock",
        &rows,
    );
    println!(
        "\nRwLock: {} reads and {} writes; plain Lock: {} reads and {} writes. RwLock reaches {:.1}× the plain lock's sections per second; longest write wait {}.",
        ours.reads,
        ours.writes,
        base.reads,
        base.writes,
        ours.sections / base.sections,
        ours.write_waits
            .iter()
            .max()
            .map_or_else(|| "-".to_owned(), |d| fmt_duration(*d)),
    );
    Ok(())
}

/// Runs `TASKS` tasks on `what` for `RUN_FOR`.
async fn measure(what: Contended) -> Result<Measured, BoxError> {
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + RUN_FOR;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (what, inside, overlaps, done) =
            (what.clone(), inside.clone(), overlaps.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut dice = Dice::new(task as u64);
            let (mut reads, mut writes) = (Vec::new(), Vec::new());
            while Instant::now() < end {
                let read = dice.roll() < READS_IN_100;
                let asked = Instant::now();
                let guard = acquire(&what, read).await?;
                let waited = asked.elapsed();
                if read {
                    reads.push(waited);
                } else {
                    writes.push(waited);
                }
                work(&inside, read, &overlaps).await;
                guard.release().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, LockError>((reads, writes))
        }));
    }
    let (mut read_waits, mut write_waits) = (Vec::new(), Vec::new());
    for task in tasks {
        let (reads, writes) = task.await??;
        read_waits.extend(reads);
        write_waits.extend(writes);
    }
    let elapsed = start.elapsed();
    let overlaps = overlaps.load(Ordering::SeqCst);
    if overlaps > 0 {
        return Err(format!("{overlaps} critical sections overlapped a writer").into());
    }
    Ok(Measured {
        sections: done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        reads: read_waits.len() as u64,
        writes: write_waits.len() as u64,
        read_waits,
        write_waits,
    })
}

/// A read or a write lease; a plain lock takes every section exclusively.
async fn acquire(what: &Contended, read: bool) -> Result<LockGuard, LockError> {
    match what {
        Contended::Plain(lock) => lock.acquire().await,
        Contended::Rw(lock) if read => lock.read().await,
        Contended::Rw(lock) => lock.write().await,
    }
}

/// The critical section: 1 ms of work, checking that a writer is alone and
/// that no reader is beside a writer.
async fn work(inside: &AtomicUsize, read: bool, overlaps: &AtomicUsize) {
    let mine = if read { 1 } else { WRITER };
    let before = inside.fetch_add(mine, Ordering::SeqCst);
    // A writer found anyone inside, or a reader found a writer.
    if (!read && before != 0) || (read && before >= WRITER) {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    tokio::time::sleep(WORK).await;
    inside.fetch_sub(mine, Ordering::SeqCst);
}

/// A small deterministic generator per task (xorshift), so each run asks
/// for the same mix: 0..100.
struct Dice(u64);

impl Dice {
    fn new(seed: u64) -> Self {
        Dice(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn roll(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % 100
    }
}
