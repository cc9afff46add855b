//! What the PostgreSQL and ZooKeeper suites share: dlock's acquire+release
//! cycle against a raw loop on the same server, as interleaved latency
//! rounds on one client and as contended throughput over a fixed window,
//! and the table they print.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend};

use super::stats::{print_table, uncontended_rows, Row, Summary};
use super::workloads::BoxError;

/// Cycles measured for the latency rows (after the warm-up) of the server
/// suites (MySQL, PostgreSQL, ZooKeeper).
pub const CYCLES: usize = 500;
/// Cycles run and thrown away first (JIT of the server, connection warm-up).
pub const WARMUP: usize = 50;
/// Clients contending in the throughput rows.
pub const CLIENTS: usize = 8;
/// How long each throughput measurement runs.
pub const WINDOW: Duration = Duration::from_secs(5);

/// A lock on `key` through `backend` (one of the suite's own connections).
pub fn lock_on<B: LockBackend + 'static>(backend: &Arc<B>, key: &str) -> Lock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    Lock::new(key).with_backend(backend)
}

/// One kind of uncontended cycle.
#[derive(Clone, Copy)]
enum Kind {
    /// dlock's `acquire`, then `release`.
    Acquire,
    /// dlock's `try_acquire`, then `release`.
    TryAcquire,
    /// The raw loop's cycle.
    Raw,
    /// dlock's `acquire` and `release` on another backend (`--beside=`).
    Beside,
}

/// The latency of the uncontended cycles.
#[derive(Debug, Clone, Copy)]
pub struct Uncontended {
    /// dlock's `acquire`+`release` cycle.
    pub ours: Summary,
    /// dlock's `try_acquire`+`release` cycle.
    pub ours_try: Summary,
    /// The raw loop's cycle.
    pub theirs: Summary,
    /// dlock's `acquire`+`release` cycle on the other backend, if one was
    /// given.
    pub beside: Option<Summary>,
}

/// The uncontended cycles' latency: dlock's `acquire` and `try_acquire`
/// cycles on `lock`, the raw loop's cycle (`raw`), in that order, and
/// dlock's cycle on `beside` if given. `cycles` samples of
/// each after `warmup` rounds, one cycle of each kind per round, the order
/// rotating from round to round, so that a burst of load from whatever
/// else shares the machine hits every kind alike.
pub async fn uncontended(
    lock: &Lock,
    beside: Option<&Lock>,
    warmup: usize,
    cycles: usize,
    mut raw: impl AsyncFnMut() -> Result<(), BoxError>,
) -> Result<Uncontended, BoxError> {
    let mut kinds = vec![Kind::Acquire, Kind::TryAcquire, Kind::Raw];
    if beside.is_some() {
        kinds.push(Kind::Beside);
    }
    let mut samples: Vec<Vec<Duration>> =
        kinds.iter().map(|_| Vec::with_capacity(cycles)).collect();
    for round in 0..warmup + cycles {
        for turn in 0..kinds.len() {
            let which = (round + turn) % kinds.len();
            let start = Instant::now();
            match kinds[which] {
                Kind::Acquire => lock.acquire().await?.release().await?,
                Kind::TryAcquire => {
                    lock.try_acquire()
                        .await?
                        .ok_or("nobody else holds the bench key")?
                        .release()
                        .await?
                }
                Kind::Raw => raw().await?,
                Kind::Beside => {
                    if let Some(other) = beside {
                        other.acquire().await?.release().await?;
                    }
                }
            }
            if round >= warmup {
                samples[which].push(start.elapsed());
            }
        }
    }
    let summaries: Vec<Summary> = samples
        .iter_mut()
        .map(|s| Summary::of(s).ok_or("no samples"))
        .collect::<Result<_, _>>()?;
    Ok(Uncontended {
        ours: summaries[0],
        ours_try: summaries[1],
        theirs: summaries[2],
        beside: summaries.get(3).copied(),
    })
}

/// One client's cycle in a throughput window.
pub trait Cycle: Send + Sync + 'static {
    /// Runs one cycle; whether it was granted the lock (a bare try may
    /// not be).
    fn cycle(&self) -> impl Future<Output = Result<bool, BoxError>> + Send;
}

/// dlock's cycle: acquire, waiting as long as it takes, then release.
impl Cycle for Lock {
    async fn cycle(&self) -> Result<bool, BoxError> {
        self.acquire().await?.release().await?;
        Ok(true)
    }
}

impl<C: Cycle> Cycle for Arc<C> {
    fn cycle(&self) -> impl Future<Output = Result<bool, BoxError>> + Send {
        C::cycle(self)
    }
}

/// dlock's contended cycles per second: one lock on `key` through each of
/// `backends`, all cycling at once for `window`.
pub async fn dlock_throughput<B: LockBackend + 'static>(
    backends: &[Arc<B>],
    key: &str,
    window: Duration,
) -> Result<f64, BoxError> {
    let locks = backends
        .iter()
        .map(|backend| lock_on(backend, key).wait(Duration::from_secs(30)));
    Ok(throughput(locks, window).await?.cycles)
}

/// The contended window of a suite that compares dlock with a bare
/// try/release loop: dlock through each of `backends` on `key`, then the
/// bare loop on each of `bare`, each for `window`; with `latency`, the
/// suite's figures, and the bare loop's rates.
pub async fn contended_against_bare<B: LockBackend + 'static, C: Cycle + Clone>(
    latency: Uncontended,
    backends: &[Arc<B>],
    key: &str,
    bare: &[C],
    window: Duration,
) -> Result<(Compared, Rates), BoxError> {
    let ours_per_sec = dlock_throughput(backends, key, window).await?;
    // The bare loop's tries, granted or not, and apart its grants.
    let bare_rates = throughput(bare.iter().cloned(), window).await?;
    let compared = Compared {
        latency,
        ours_per_sec,
        theirs_per_sec: bare_rates.cycles,
    };
    Ok((compared, bare_rates))
}

/// What a throughput window counted, per second.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    /// Cycles, granted or not.
    pub cycles: f64,
    /// Cycles that were granted the lock.
    pub granted: f64,
}

/// Every client cycling at once, each in a task of its own, for `window`.
pub async fn throughput<C: Cycle>(
    clients: impl IntoIterator<Item = C>,
    window: Duration,
) -> Result<Rates, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    // Counted apart from the cycles, so that a loop whose every cycle is
    // granted (a lock that waits) does no more work per cycle than before.
    let refused = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in clients {
        let (stop, cycles, refused) = (stop.clone(), cycles.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if !client.cycle().await? {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, BoxError>(())
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let (counted, refused) = (
        cycles.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    let elapsed = start.elapsed().as_secs_f64();
    for task in tasks {
        task.await??;
    }
    Ok(Rates {
        cycles: counted as f64 / elapsed,
        granted: (counted - refused) as f64 / elapsed,
    })
}

/// The figures of one suite: its uncontended cycles and its contended
/// throughput, dlock's and the raw loop's.
pub struct Compared {
    /// The uncontended cycles.
    pub latency: Uncontended,
    /// dlock's contended cycles per second.
    pub ours_per_sec: f64,
    /// The raw loop's contended cycles per second.
    pub theirs_per_sec: f64,
}

impl Compared {
    /// Prints the table: the uncontended rows (with `try_acquire`'s p99 when
    /// `with_try_p99`), then the throughput row, `throughput_what`.
    pub fn print_table(
        &self,
        title: &str,
        baseline_name: &str,
        with_try_p99: bool,
        throughput_what: &str,
    ) {
        let Uncontended {
            ours,
            ours_try,
            theirs,
            ..
        } = &self.latency;
        let mut rows = uncontended_rows(ours, ours_try, theirs, with_try_p99);
        rows.push(Row::throughput(
            throughput_what,
            self.ours_per_sec,
            self.theirs_per_sec,
        ));
        print_table(title, baseline_name, &rows);
    }

    /// [`Compared::print_table`] for a bare try/release loop of `clients`
    /// connections (its throughput counts tries, not waits).
    pub fn print_bare_table(&self, title: &str, baseline_name: &str, clients: usize) {
        self.print_table(
            title,
            baseline_name,
            false,
            &format!("hand-offs/s, {clients} clients, one key (bare: tries, no waiting)"),
        );
    }

    /// dlock's `acquire` and `try_acquire` cycles' p50, each over the raw
    /// loop's.
    pub fn p50_ratios(&self) -> (f64, f64) {
        let theirs = self.latency.theirs.p50.as_secs_f64();
        (
            self.latency.ours.p50.as_secs_f64() / theirs,
            self.latency.ours_try.p50.as_secs_f64() / theirs,
        )
    }
}
