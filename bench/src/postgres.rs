//! The PostgreSQL suite: dlock's acquire+release cycle against a bare
//! `pg_try_advisory_lock` / `pg_advisory_unlock` loop on one connection
//! with `tokio-postgres`, on the same server, in the same run.
//!
//! - **Cycle latency** (one client, one key, no contention): the bare loop
//!   is two round trips with no write; dlock's cycle is two round trips
//!   too (the try with the fence upsert, the release with the row cleared
//!   and the `NOTIFY`), each a committed write. The ratio is what the
//!   fencing token and the holder's row cost (on a server with `fsync` on,
//!   two commits). The kinds of cycle run interleaved, one of each per
//!   round in a rotating order.
//! - **Contended throughput** (8 clients, each its own backend, one key):
//!   dlock hands the lock over through `NOTIFY`; the bare loop runs the same
//!   try/unlock pairs on 8 connections, which exclude each other only as
//!   far as a failed try (no waiting), so it is the server's ceiling for
//!   this traffic, not a lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::postgres::{advisory_key, PostgresBackend};
use dlock::{Lock, LockBackend};
use tokio_postgres::{Client, NoTls, Statement};

use super::stats::{print_table, uncontended_rows, Row, Summary};
use super::workloads::BoxError;

/// Cycles measured for the latency rows (after the warm-up).
const CYCLES: usize = 500;
/// Cycles run and thrown away first.
const WARMUP: usize = 50;
/// Clients contending in the throughput rows.
const CLIENTS: usize = 8;
/// How long each throughput measurement runs.
const WINDOW: Duration = Duration::from_secs(5);

/// A bare connection and its two prepared statements.
struct Bare {
    client: Client,
    try_lock: Statement,
    unlock: Statement,
}

impl Bare {
    async fn connect(url: &str) -> Result<Bare, BoxError> {
        let (client, connection) = url
            .parse::<tokio_postgres::Config>()?
            .connect(NoTls)
            .await?;
        tokio::spawn(connection);
        let try_lock = client
            .prepare("SELECT pg_try_advisory_lock($1::int8)")
            .await?;
        let unlock = client
            .prepare("SELECT pg_advisory_unlock($1::int8)")
            .await?;
        Ok(Bare {
            client,
            try_lock,
            unlock,
        })
    }

    /// One try, and the unlock if it was granted; whether it was.
    async fn cycle(&self, id: i64) -> Result<bool, BoxError> {
        let granted: bool = self.client.query_one(&self.try_lock, &[&id]).await?.get(0);
        if granted {
            self.client.query_one(&self.unlock, &[&id]).await?;
        }
        Ok(granted)
    }
}

/// Runs the PostgreSQL suite against `url` (`postgres://user@host:port/db`,
/// no dlock parameters: the bare loop reads it too) and prints the table.
///
/// # Errors
/// Any connection or server error, with the server's message.
pub async fn run(url: &str, beside: Option<&str>) -> Result<(), BoxError> {
    let key = format!("bench:{}", std::process::id());
    let id = advisory_key(&key);
    let mut backends = Vec::new();
    let mut bare = Vec::new();
    for _ in 0..CLIENTS {
        backends.push(Arc::new(PostgresBackend::connect(url).await?));
        bare.push(Arc::new(Bare::connect(url).await?));
    }
    let fsync = bare[0].client.query_one("SHOW fsync", &[]).await?;
    let fsync: &str = fsync.get(0);
    println!(
        "PostgreSQL bench on {} (fsync={fsync}): {CYCLES} cycles after {WARMUP} warm-up; {CLIENTS} clients for {WINDOW:?}",
        dlock::url::redact(url),
    );
    let redis: Option<Arc<dyn LockBackend>> = match beside {
        Some(other) => Some(dlock::connect(other).await?),
        None => None,
    };
    let (latencies, redis_cycle) =
        interleaved_latency(&backends[0], &key, &bare[0], id, redis.as_ref()).await?;
    let [ours, ours_try, theirs] = latencies;
    let ours_tp = dlock_throughput(&backends, &key).await?;
    let (theirs_tp, theirs_granted) = bare_throughput(&bare, id).await?;
    print_table(
        "PostgreSQL: dlock vs a bare pg_try_advisory_lock/pg_advisory_unlock loop",
        "bare tokio-postgres",
        &{
            let mut rows = uncontended_rows(&ours, &ours_try, &theirs, false);
            rows.push(Row::throughput(
                &format!("hand-offs/s, {CLIENTS} clients, one key (bare: tries, no waiting)"),
                ours_tp,
                theirs_tp,
            ));
            rows
        },
    );
    println!(
        "\nacquire+release p50 = {:.2}× the bare try+unlock pair; try_acquire+release p50 = {:.2}×; the bare contended loop was granted {theirs_granted:.0}/s",
        ours.p50.as_secs_f64() / theirs.p50.as_secs_f64(),
        ours_try.p50.as_secs_f64() / theirs.p50.as_secs_f64(),
    );
    if let (Some(other), Some(cycle)) = (beside, redis_cycle) {
        println!(
            "dlock on {} in the same run, interleaved: acquire+release p50 {:.0} µs, p99 {:.0} µs ({:.2}× dlock on PostgreSQL's p50)",
            dlock::url::redact(other),
            cycle.p50.as_secs_f64() * 1e6,
            cycle.p99.as_secs_f64() * 1e6,
            cycle.p50.as_secs_f64() / ours.p50.as_secs_f64(),
        );
    }
    Ok(())
}

fn lock_on(backend: &Arc<PostgresBackend>, key: &str) -> Lock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    Lock::new(key).with_backend(backend)
}

#[derive(Clone, Copy)]
enum Cycle {
    Acquire,
    TryAcquire,
    Bare,
    /// dlock's acquire and release on the other backend (`--beside=`).
    Beside,
}

/// The uncontended cycles, interleaved: dlock's acquire and try_acquire on
/// PostgreSQL, the bare loop, and dlock on `beside` if given (its summary
/// second).
async fn interleaved_latency(
    backend: &Arc<PostgresBackend>,
    key: &str,
    bare: &Bare,
    id: i64,
    beside: Option<&Arc<dyn LockBackend>>,
) -> Result<([Summary; 3], Option<Summary>), BoxError> {
    let lock = lock_on(backend, key).wait(Duration::from_secs(10));
    let other = beside.map(|b| {
        Lock::new(key)
            .with_backend(b.clone())
            .wait(Duration::from_secs(10))
    });
    let mut kinds = vec![Cycle::Acquire, Cycle::TryAcquire, Cycle::Bare];
    if other.is_some() {
        kinds.push(Cycle::Beside);
    }
    let mut samples: [Vec<Duration>; 4] = std::array::from_fn(|_| Vec::with_capacity(CYCLES));
    for round in 0..WARMUP + CYCLES {
        for turn in 0..kinds.len() {
            let which = (round + turn) % kinds.len();
            let start = Instant::now();
            match kinds[which] {
                Cycle::Acquire => lock.acquire().await?.release().await?,
                Cycle::TryAcquire => {
                    lock.try_acquire()
                        .await?
                        .ok_or("nobody else holds the bench key")?
                        .release()
                        .await?
                }
                Cycle::Bare => {
                    if !bare.cycle(id).await? {
                        return Err("the bare loop found the bench key held".into());
                    }
                }
                Cycle::Beside => {
                    if let Some(other) = &other {
                        other.acquire().await?.release().await?;
                    }
                }
            }
            if round >= WARMUP {
                samples[which].push(start.elapsed());
            }
        }
    }
    let [ours, ours_try, theirs, beside] = samples.map(|mut s| Summary::of(&mut s));
    match (ours, ours_try, theirs) {
        (Some(a), Some(b), Some(c)) => Ok(([a, b, c], beside)),
        _ => Err("no samples".into()),
    }
}

async fn dlock_throughput(backends: &[Arc<PostgresBackend>], key: &str) -> Result<f64, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for backend in backends {
        let lock = lock_on(backend, key).wait(Duration::from_secs(30));
        let (stop, done) = (stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                lock.acquire().await?.release().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, dlock::LockError>(())
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(WINDOW).await;
    stop.store(true, Ordering::Relaxed);
    let counted = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    for t in tasks {
        t.await??;
    }
    Ok(counted as f64 / elapsed.as_secs_f64())
}

/// Tries per second and grants per second of the bare loop on `CLIENTS` connections.
async fn bare_throughput(bare: &[Arc<Bare>], id: i64) -> Result<(f64, f64), BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let tries = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for conn in bare {
        let (conn, stop, tries, granted) =
            (conn.clone(), stop.clone(), tries.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if conn.cycle(id).await.map_err(|e| e.to_string())? {
                    granted.fetch_add(1, Ordering::Relaxed);
                }
                tries.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(())
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(WINDOW).await;
    stop.store(true, Ordering::Relaxed);
    let (t, g) = (
        tries.load(Ordering::Relaxed),
        granted.load(Ordering::Relaxed),
    );
    let elapsed = start.elapsed().as_secs_f64();
    for task in tasks {
        task.await??;
    }
    Ok((t as f64 / elapsed, g as f64 / elapsed))
}
