//! The file suite: dlock's cycle on `file:///dir` against a bare `flock`
//! loop on the same directory, in the same run.
//!
//! - **Cycle latency** (one client, one key, no contention): the bare loop
//!   opens the file, takes `flock(LOCK_EX|LOCK_NB)`, unlocks and closes
//!   (the close is what wakes a waiting process, so dlock closes too);
//!   dlock's cycle adds the check that the locked file is still the one at
//!   its name, the fence counter (read and written in place) and the
//!   holder's record, then the lease's
//!   registration and release. A second baseline row, `flock` on a
//!   descriptor kept open, shows the lock calls alone.
//! - **Hand-off** (a holder, one waiter on a backend of its own, as another
//!   process's): from the holder's `release` returning to the waiter
//!   holding the lock, woken by inotify; against a thread blocked in
//!   `flock(LOCK_EX)`, which the kernel wakes itself.
//! - **Contended throughput** (8 backends, one key): hand-offs per second,
//!   against 8 bare loops whose tries exclude each other only as far as a
//!   failed try (no waiting): the ceiling of this traffic, not a lock.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::file::FileBackend;
use dlock::{Lock, LockBackend};
use rustix::fs::{FlockOperation, Mode, OFlags};

use super::cycle_suite::{self, dlock_throughput, lock_on, throughput, uncontended, Compared};
use super::stats::{print_table, Row, Summary};
use super::workloads::{handoffs, BoxError};

/// Cycles measured for the latency rows (after the warm-up).
const CYCLES: usize = 2_000;
/// Cycles run and thrown away first.
const WARMUP: usize = 200;
/// Hand-offs measured.
const HANDOFFS: usize = 300;
/// How long a waiter is given to be waiting before the release.
const WAITER_SETTLE: Duration = Duration::from_millis(2);
/// Clients contending in the throughput rows.
const CLIENTS: usize = 8;
/// How long each throughput measurement runs.
const WINDOW: Duration = Duration::from_secs(5);

/// A bare open + `flock(LOCK_EX|LOCK_NB)` + unlock + close of `path`;
/// whether the lock was granted.
fn bare_cycle(path: &Path) -> Result<bool, BoxError> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC;
    let file = File::from(rustix::fs::open(path, flags, Mode::from_raw_mode(0o600))?);
    match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            rustix::fs::flock(&file, FlockOperation::Unlock)?;
            Ok(true)
        }
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The bare loop's client for the throughput rows.
struct Bare(PathBuf);

impl cycle_suite::Cycle for Bare {
    async fn cycle(&self) -> Result<bool, BoxError> {
        let granted = bare_cycle(&self.0)?;
        // A bare loop on one runtime thread must let the others run.
        tokio::task::yield_now().await;
        Ok(granted)
    }
}

/// Runs the file suite in the directory of `url` (`file:///dir`) and
/// prints the tables.
///
/// # Errors
/// A refused directory, or a failed system call.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let pid = std::process::id();
    let key = format!("bench:{pid}");
    let mut backends = Vec::new();
    for _ in 0..CLIENTS {
        backends.push(Arc::new(FileBackend::connect(url).await?));
    }
    let bare_path = backends[0].lock_path(&format!("bench-bare:{pid}"));
    println!(
        "file bench in {url}: {CYCLES} cycles after {WARMUP} warm-up; {HANDOFFS} hand-offs; {CLIENTS} clients for {WINDOW:?}"
    );
    let lock = lock_on(&backends[0], &key).wait(Duration::from_secs(10));
    // The core's own share: the same cycle on `memory://`, interleaved.
    let memory = Lock::new(key.as_str())
        .with_backend(dlock::connect("memory://").await?)
        .wait(Duration::from_secs(10));
    let latency = uncontended(&lock, Some(&memory), WARMUP, CYCLES, async || {
        if !bare_cycle(&bare_path)? {
            return Err("the bare loop found its file locked".into());
        }
        Ok(())
    })
    .await?;
    let kept_open = kept_open_cycle(&bare_path)?;
    let backend_alone = backend_cycle(&backends[0], &key).await?;
    let ours_handoff = handoff_ours(&backends[0], &backends[1], &key).await?;
    let bare_handoff = handoff_bare(&bare_path).await?;
    let ours_per_sec = dlock_throughput(&backends, &key, WINDOW).await?;
    let bare_rates = throughput((0..CLIENTS).map(|_| Bare(bare_path.clone())), WINDOW).await?;
    let compared = Compared {
        latency,
        ours_per_sec,
        theirs_per_sec: bare_rates.cycles,
    };
    compared.print_table(
        "file: dlock vs a bare open + flock + unlock + close loop",
        "bare flock",
        true,
        &format!("hand-offs/s, {CLIENTS} clients, one key (bare: tries, no waiting)"),
    );
    print_table(
        "file: hand-off from release to the next holder",
        "thread blocked in flock",
        &[
            Row::latency("hand-off p50", ours_handoff.p50, bare_handoff.p50),
            Row::latency("hand-off p99", ours_handoff.p99, bare_handoff.p99),
        ],
    );
    let (acquire, try_acquire) = compared.p50_ratios();
    let p50 = |d: Duration| d.as_secs_f64() * 1e6;
    if let Some(memory) = latency.beside {
        println!(
            "\nwhere the cycle goes (p50): the backend's calls alone (try_acquire + release, no core) {:.1} µs; dlock's cycle on memory:// (the core alone) {:.1} µs; on file:// {:.1} µs",
            p50(backend_alone.p50),
            p50(memory.p50),
            p50(latency.ours.p50),
        );
    }
    println!(
        "\nacquire+release p50 = {acquire:.2}× the bare open+flock+unlock+close cycle (target ≤ 2×); try_acquire+release p50 = {try_acquire:.2}×; \
         flock+unlock alone on an open descriptor: p50 {:.1} µs; hand-off p50 {:.0} µs (target ≤ 1,000 µs), the kernel's own {:.0} µs",
        p50(kept_open.p50),
        p50(ours_handoff.p50),
        p50(bare_handoff.p50),
    );
    Ok(())
}

/// The backend's own calls, without the core: `try_acquire` (open,
/// `flock`, the same-file check, the fence, the record, the lease's
/// registration) and `release`.
async fn backend_cycle(backend: &Arc<FileBackend>, key: &str) -> Result<Summary, BoxError> {
    let mut samples = Vec::with_capacity(CYCLES);
    for round in 0..WARMUP + CYCLES {
        let req = dlock::backend::AcquireRequest {
            key: key.to_owned(),
            token: format!("{round:032x}@bench"),
            ttl: Duration::from_secs(30),
        };
        let start = Instant::now();
        let lease = backend
            .try_acquire(&req)
            .await?
            .ok_or("the bench key is held")?;
        backend.release(&lease).await?;
        if round >= WARMUP {
            samples.push(start.elapsed());
        }
    }
    Ok(Summary::of(&mut samples).ok_or("no samples")?)
}

/// `flock` + unlock on one descriptor kept open: the lock calls alone.
fn kept_open_cycle(path: &Path) -> Result<Summary, BoxError> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC;
    let file = File::from(rustix::fs::open(path, flags, Mode::from_raw_mode(0o600))?);
    let mut samples = Vec::with_capacity(CYCLES);
    for round in 0..WARMUP + CYCLES {
        let start = Instant::now();
        rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive)?;
        rustix::fs::flock(&file, FlockOperation::Unlock)?;
        if round >= WARMUP {
            samples.push(start.elapsed());
        }
    }
    Ok(Summary::of(&mut samples).ok_or("no samples")?)
}

/// The holder on `holder`, the waiter on `waiter` (a backend of its own).
async fn handoff_ours(
    holder: &Arc<FileBackend>,
    waiter: &Arc<FileBackend>,
    key: &str,
) -> Result<Summary, BoxError> {
    let holder: Lock = lock_on(holder, key);
    let waiter_backend: Arc<dyn LockBackend> = waiter.clone();
    let waiter = Lock::new(key)
        .with_backend(waiter_backend)
        .wait(Duration::from_secs(10));
    handoffs(&holder, &waiter, WARMUP / 10, HANDOFFS, WAITER_SETTLE).await
}

/// A holder's descriptor and a thread blocked in `flock(LOCK_EX)` on its
/// own open of the file: the kernel's hand-off.
async fn handoff_bare(path: &Path) -> Result<Summary, BoxError> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC;
    let mut samples = Vec::with_capacity(HANDOFFS);
    for i in 0..WARMUP / 10 + HANDOFFS {
        let held = File::from(rustix::fs::open(path, flags, Mode::from_raw_mode(0o600))?);
        rustix::fs::flock(&held, FlockOperation::NonBlockingLockExclusive)?;
        let path = path.to_owned();
        let waiting = std::thread::spawn(move || -> Result<Instant, rustix::io::Errno> {
            let file = File::from(rustix::fs::open(&path, flags, Mode::from_raw_mode(0o600))?);
            rustix::fs::flock(&file, FlockOperation::LockExclusive)?;
            Ok(Instant::now())
        });
        tokio::time::sleep(WAITER_SETTLE).await;
        let released = Instant::now();
        rustix::fs::flock(&held, FlockOperation::Unlock)?;
        drop(held);
        let got = waiting
            .join()
            .map_err(|_| "the waiting thread panicked")??;
        if i >= WARMUP / 10 {
            samples.push(got.saturating_duration_since(released));
        }
    }
    Ok(Summary::of(&mut samples).ok_or("no samples")?)
}
