//! The ZooKeeper suite: dlock's acquire+release cycle against a raw
//! create-ephemeral-sequential/delete loop with `zookeeper-client`, on the
//! same server, in the same run.
//!
//! - **Cycle latency** (one client, one key, no contention): the raw loop is
//!   create + delete; dlock's `acquire` and `try_acquire` cycles add the
//!   queue check (a listing of the key's children). The ratio is what the
//!   queue check and the fencing token cost. The three kinds of cycle run
//!   interleaved, one of each per round in a rotating order, so a burst of
//!   load from whatever else shares the machine hits all three alike.
//! - **Contended throughput** (8 clients, each its own session, one key):
//!   dlock hands the lock over through the predecessor watch; the raw loop
//!   runs the same create/delete pairs with no exclusion at all, so it is
//!   the server's ceiling for this traffic, not a lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{Lock, LockBackend};
use zookeeper_client::{Acls, Client, CreateMode};

use super::stats::{print_table, uncontended_rows, Row, Summary};

/// Cycles measured for the latency rows (after the warm-up).
const CYCLES: usize = 500;
/// Cycles run and thrown away first (JIT of the server, connection warm-up).
const WARMUP: usize = 50;
/// Clients contending in the throughput rows.
const CLIENTS: usize = 8;
/// How long each throughput measurement runs.
const WINDOW: Duration = Duration::from_secs(5);

use super::workloads::BoxError;

/// Runs the ZooKeeper suite against `url` (`zk://host:port[/chroot]`) and
/// prints the table.
///
/// # Errors
/// Any connection or server error, with the server's message.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let run_id = std::process::id();
    let key = format!("bench:{run_id}");
    let raw_dir = format!("/dlock-bench-raw/{run_id}");

    let backends = connect_all(url, CLIENTS).await?;
    // The raw loop gets its own sessions, so its clients do not share a
    // connection with dlock's.
    let raw_backends = connect_all(url, CLIENTS).await?;
    let raw: Vec<Client> = raw_backends
        .iter()
        .map(|b| b.client().ok_or("a freshly opened session already ended"))
        .collect::<Result<_, _>>()?;
    raw[0]
        .mkdir(
            &raw_dir,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await?;

    println!(
        "ZooKeeper bench on {} (session timeout {:?}): {CYCLES} cycles after {WARMUP} warm-up; {CLIENTS} clients for {WINDOW:?}",
        dlock::url::redact(url),
        backends[0].session_timeout()
    );

    let [ours, ours_try, theirs] =
        interleaved_latency(&backends[0], &key, &raw[0], &raw_dir).await?;
    let ours_tp = dlock_throughput(&backends, &key).await?;
    let theirs_tp = raw_throughput(&raw, &raw_dir).await?;

    let _ = raw[0].delete(&raw_dir, None).await;
    let _ = raw[0].delete("/dlock-bench-raw", None).await;

    print_table(
        "ZooKeeper: dlock vs raw create-ephemeral-sequential/delete",
        "raw zookeeper-client",
        &{
            let mut rows = uncontended_rows(&ours, &ours_try, &theirs, true);
            rows.push(Row::throughput(
                &format!("cycles/s, {CLIENTS} clients, one key (raw: no exclusion)"),
                ours_tp,
                theirs_tp,
            ));
            rows
        },
    );
    println!(
        "\nacquire+release p50 = {:.2}× the raw create+delete pair; try_acquire+release p50 = {:.2}×",
        ours.p50.as_secs_f64() / theirs.p50.as_secs_f64(),
        ours_try.p50.as_secs_f64() / theirs.p50.as_secs_f64(),
    );
    Ok(())
}

async fn connect_all(url: &str, n: usize) -> Result<Vec<Arc<ZooKeeperBackend>>, BoxError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Arc::new(ZooKeeperBackend::connect(url).await?));
    }
    Ok(out)
}

fn lock_on(backend: &Arc<ZooKeeperBackend>, key: &str) -> Lock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    Lock::new(key).with_backend(backend)
}

/// One cycle of a latency row.
#[derive(Clone, Copy)]
enum Cycle {
    /// dlock's `acquire`, then `release`.
    Acquire,
    /// dlock's `try_acquire`, then `release`.
    TryAcquire,
    /// A raw create-ephemeral-sequential, then a delete.
    Raw,
}

/// The latency of dlock's `acquire` and `try_acquire` cycles and of the raw
/// pair, in that order: [`CYCLES`] of each after [`WARMUP`] rounds, one of
/// each per round, the order rotating from round to round.
async fn interleaved_latency(
    backend: &Arc<ZooKeeperBackend>,
    key: &str,
    raw: &Client,
    raw_dir: &str,
) -> Result<[Summary; 3], BoxError> {
    let lock = lock_on(backend, key).wait(Duration::from_secs(10));
    let kinds = [Cycle::Acquire, Cycle::TryAcquire, Cycle::Raw];
    let mut samples: [Vec<Duration>; 3] = std::array::from_fn(|_| Vec::with_capacity(CYCLES));
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
                Cycle::Raw => raw_cycle(raw, raw_dir).await?,
            }
            if round >= WARMUP {
                samples[which].push(start.elapsed());
            }
        }
    }
    let [ours, ours_try, theirs] = samples.map(|mut s| Summary::of(&mut s));
    match (ours, ours_try, theirs) {
        (Some(a), Some(b), Some(c)) => Ok([a, b, c]),
        _ => Err("no samples".into()),
    }
}

async fn raw_cycle(client: &Client, dir: &str) -> Result<(), BoxError> {
    let prefix = format!("{dir}/_c_bench-lock-");
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, seq) = client.create(&prefix, b"", &options).await?;
    client.delete(&format!("{prefix}{seq}"), None).await?;
    Ok(())
}

async fn dlock_throughput(backends: &[Arc<ZooKeeperBackend>], key: &str) -> Result<f64, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for backend in backends {
        let lock = lock_on(backend, key).wait(Duration::from_secs(30));
        let (stop, done) = (stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.acquire().await?;
                guard.release().await?;
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

async fn raw_throughput(clients: &[Client], dir: &str) -> Result<f64, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in clients {
        let (client, dir) = (client.clone(), dir.to_owned());
        let (stop, done) = (stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                raw_cycle(&client, &dir).await.map_err(|e| e.to_string())?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(())
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
