//! The dlock side of the lock workloads, shared by the suites that compare
//! dlock with a baseline (`redis`, `redlock`): the same code measures every
//! backend, so differences between suites are the backends'.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend};

use super::stats::Summary;

/// A boxed error that crosses task boundaries.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease of every benchmark lock: long, so no run ever waits for expiry.
pub const TTL: Duration = Duration::from_secs(30);

/// How much work each workload does.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// (a) acquire+release cycles of one task, per side.
    pub uncontended_cycles: usize,
    /// (b) tasks, each on its own key.
    pub distinct_tasks: usize,
    /// (b) cycles per task.
    pub distinct_cycles: usize,
    /// (c) tasks on one key.
    pub hot_tasks: usize,
    /// (c) increments per task.
    pub hot_increments: u64,
    /// (d) hand-offs measured.
    pub handoffs: usize,
}

impl Sizes {
    /// The footer line under a suite's table.
    pub fn describe(&self) -> String {
        format!(
            "(a) {} cycles; (b) {}×{}; (c) {}×{}, counter checked; (d) {} hand-offs",
            self.uncontended_cycles,
            self.distinct_tasks,
            self.distinct_cycles,
            self.hot_tasks,
            self.hot_increments,
            self.handoffs
        )
    }
}

/// How many alternating rounds (a) runs: dlock, baseline, dlock, … so that
/// neither side always runs first (warm-up, CPU frequency, a neighbour's
/// build): both see the same machine.
const UNCONTENDED_ROUNDS: usize = 4;

/// One round of (a) on one side: each cycle's duration.
pub type Round<'a> = Pin<Box<dyn Future<Output = Result<Vec<Duration>, BoxError>> + Send + 'a>>;

/// (a) for dlock and a baseline: four alternating rounds of each (see
/// `UNCONTENDED_ROUNDS`), `ours(cycles)` and `baseline(cycles)` giving one
/// round's samples. Returns the summaries of dlock's and the baseline's.
pub async fn alternating<'a>(
    sizes: &Sizes,
    mut ours: impl FnMut(usize) -> Round<'a>,
    mut baseline: impl FnMut(usize) -> Round<'a>,
) -> Result<(Summary, Summary), BoxError> {
    let cycles = sizes.uncontended_cycles / UNCONTENDED_ROUNDS;
    let (mut ours_samples, mut base_samples) = (Vec::new(), Vec::new());
    for _ in 0..UNCONTENDED_ROUNDS {
        ours_samples.extend(ours(cycles).await?);
        base_samples.extend(baseline(cycles).await?);
    }
    let ours = Summary::of(&mut ours_samples).ok_or("no samples")?;
    let baseline = Summary::of(&mut base_samples).ok_or("no samples")?;
    Ok((ours, baseline))
}

/// One round of (a): `cycles` acquire+release cycles of one task, each
/// cycle's duration.
pub async fn uncontended_dlock(
    cycles: usize,
    backend: &Arc<dyn LockBackend>,
    key: &str,
) -> Result<Vec<Duration>, BoxError> {
    let lock = Lock::new(key).ttl(TTL).with_backend(backend.clone());
    let mut samples = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        let start = Instant::now();
        lock.acquire().await?.release().await?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

pub async fn distinct_dlock(
    sizes: &Sizes,
    backend: &Arc<dyn LockBackend>,
    run_id: &str,
) -> Result<f64, BoxError> {
    let sizes = *sizes;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..sizes.distinct_tasks {
        let lock = Lock::new(format!("bench:{run_id}:b:{t}"))
            .ttl(TTL)
            .with_backend(backend.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..sizes.distinct_cycles {
                lock.acquire().await?.release().await?;
            }
            Ok::<_, dlock::LockError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((sizes.distinct_tasks * sizes.distinct_cycles) as f64 / start.elapsed().as_secs_f64())
}

/// A counter updated with a non-atomic read-then-write, so lost updates show
/// any failure of mutual exclusion.
pub async fn critical_increment(counter: &AtomicU64) {
    let read = counter.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    counter.store(read + 1, Ordering::SeqCst);
}

/// One side of (c): a lock on the one hot key, taken and given back by
/// many tasks at once.
pub trait HotLock: Clone + Send + Sync + 'static {
    /// What a holder keeps until it gives the lock back.
    type Held: Send;
    /// Takes the lock, waiting as long as it takes.
    fn lock(&self) -> impl Future<Output = Result<Self::Held, BoxError>> + Send;
    /// Gives it back.
    fn unlock(&self, held: Self::Held) -> impl Future<Output = Result<(), BoxError>> + Send;
}

impl HotLock for Lock {
    type Held = dlock::LockGuard;

    async fn lock(&self) -> Result<dlock::LockGuard, BoxError> {
        Ok(self.acquire().await?)
    }

    async fn unlock(&self, held: dlock::LockGuard) -> Result<(), BoxError> {
        Ok(held.release().await?)
    }
}

/// What (c) measured on one side.
#[derive(Debug, Clone, Copy)]
pub struct HotKey {
    /// Critical sections per second.
    pub per_sec: f64,
    /// From calling acquire to holding, per acquisition.
    pub waits: Summary,
    /// The longest of those waits.
    pub max_wait: Duration,
    /// The share of acquisitions served in arrival order: those that got
    /// the lock before nobody who had asked for it earlier (see
    /// [`in_arrival_order`]).
    pub in_order: f64,
}

/// (c): `sizes.hot_tasks` tasks each take `lock`, increment a shared counter
/// non-atomically (lost updates would show an overlap), and give it back,
/// `sizes.hot_increments` times. Every acquisition's arrival and grant are
/// recorded on this process's one clock.
pub async fn hot_key<L: HotLock>(sizes: &Sizes, lock: L) -> Result<HotKey, BoxError> {
    let sizes = *sizes;
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..sizes.hot_tasks {
        let (lock, counter) = (lock.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let mut turns = Vec::with_capacity(sizes.hot_increments as usize);
            for _ in 0..sizes.hot_increments {
                let arrived = Instant::now();
                let held = lock.lock().await?;
                turns.push((arrived, Instant::now()));
                critical_increment(&counter).await;
                lock.unlock(held).await?;
            }
            Ok::<_, BoxError>(turns)
        }));
    }
    let mut turns = Vec::new();
    for task in tasks {
        turns.extend(task.await??);
    }
    let elapsed = start.elapsed();
    check_counter(&counter, sizes.hot_tasks as u64 * sizes.hot_increments)?;
    let mut waits: Vec<Duration> = turns.iter().map(|(a, g)| *g - *a).collect();
    let max_wait = waits.iter().copied().max().unwrap_or_default();
    Ok(HotKey {
        per_sec: counter.load(Ordering::SeqCst) as f64 / elapsed.as_secs_f64(),
        waits: Summary::of(&mut waits).ok_or("no samples")?,
        max_wait,
        in_order: in_arrival_order(&mut turns),
    })
}

/// The share of `(arrived, granted)` acquisitions that overtook nobody: no
/// acquisition that arrived earlier was granted later. 1.0 is a FIFO lock;
/// a lock that lets newcomers barge in scores lower.
pub fn in_arrival_order(turns: &mut [(Instant, Instant)]) -> f64 {
    if turns.is_empty() {
        return 1.0;
    }
    turns.sort_unstable_by_key(|&(arrived, _)| arrived);
    let mut latest_grant_before: Option<Instant> = None;
    let mut in_order = 0usize;
    for &(_, granted) in turns.iter() {
        if latest_grant_before.is_none_or(|latest| latest <= granted) {
            in_order += 1;
        }
        latest_grant_before = Some(latest_grant_before.map_or(granted, |l| l.max(granted)));
    }
    in_order as f64 / turns.len() as f64
}

/// (c) for dlock on `backend`.
pub async fn hot_key_dlock(
    sizes: &Sizes,
    backend: &Arc<dyn LockBackend>,
    key: &str,
) -> Result<HotKey, BoxError> {
    hot_key(sizes, Lock::new(key).ttl(TTL).with_backend(backend.clone())).await
}

/// The rows (c) prints for two sides.
pub fn hot_key_rows(ours: &HotKey, baseline: &HotKey) -> [super::stats::Row; 4] {
    use super::stats::Row;
    [
        Row::throughput(
            "(c) 16 tasks, one key, critical sections",
            ours.per_sec,
            baseline.per_sec,
        ),
        Row::latency(
            "(c) wait for the lock, p99",
            ours.waits.p99,
            baseline.waits.p99,
        ),
        Row::latency(
            "(c) wait for the lock, max",
            ours.max_wait,
            baseline.max_wait,
        ),
        Row::share(
            "(c) acquisitions served in arrival order",
            ours.in_order,
            baseline.in_order,
        ),
    ]
}

/// The rows (d) prints for two sides.
pub fn handoff_rows(ours: &Summary, baseline: &Summary) -> [super::stats::Row; 2] {
    use super::stats::Row;
    [
        Row::latency(
            "(d) hand-off release→next holder, p50",
            ours.p50,
            baseline.p50,
        ),
        Row::latency(
            "(d) hand-off release→next holder, p99",
            ours.p99,
            baseline.p99,
        ),
    ]
}

pub fn check_counter(counter: &AtomicU64, expected: u64) -> Result<(), BoxError> {
    let got = counter.load(Ordering::SeqCst);
    if got != expected {
        return Err(format!("mutual exclusion failed: counter {got}, expected {expected}").into());
    }
    Ok(())
}

pub async fn handoff_dlock(
    sizes: &Sizes,
    holder: &Arc<dyn LockBackend>,
    waiter: &Arc<dyn LockBackend>,
    key: &str,
) -> Result<Summary, BoxError> {
    let hold = Lock::new(key).ttl(TTL).with_backend(holder.clone());
    let wait = Lock::new(key).ttl(TTL).with_backend(waiter.clone());
    // Let the waiter start waiting before the release.
    handoffs(&hold, &wait, 0, sizes.handoffs, Duration::from_millis(3)).await
}

/// `holder` takes the key, `waiter` starts waiting for it, `settle` later
/// the holder releases: the time from the release to the waiter's grant,
/// `warmup + count` times, the first `warmup` not kept.
pub async fn handoffs(
    holder: &Lock,
    waiter: &Lock,
    warmup: usize,
    count: usize,
    settle: Duration,
) -> Result<Summary, BoxError> {
    let mut samples = Vec::with_capacity(count);
    for i in 0..warmup + count {
        let held = holder.acquire().await?;
        let waiter = waiter.clone();
        let waiting = tokio::spawn(async move {
            let guard = waiter.acquire().await?;
            let at = Instant::now();
            guard.release().await?;
            Ok::<_, dlock::LockError>(at)
        });
        tokio::time::sleep(settle).await;
        let released = Instant::now();
        held.release().await?;
        let got = waiting.await??;
        if i >= warmup {
            samples.push(got.saturating_duration_since(released));
        }
    }
    Summary::of(&mut samples).ok_or_else(|| "no samples".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_order_counts_who_overtook_nobody() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // FIFO: granted in the order they arrived.
        let mut fifo = vec![(at(0), at(10)), (at(1), at(20)), (at(2), at(30))];
        assert_eq!(in_arrival_order(&mut fifo), 1.0);
        // The third overtakes the first two; they are still in order with
        // each other, the third is not.
        let mut barging = vec![(at(0), at(20)), (at(1), at(30)), (at(2), at(10))];
        assert!((in_arrival_order(&mut barging) - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(in_arrival_order(&mut []), 1.0);
    }
}
