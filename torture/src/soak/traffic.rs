//! The soak's mixed traffic, the operator's run of issue 68: tasks taking plain locks on
//! many keys with short waits, some acquisitions cancelled mid-wait (a `timeout` around a
//! wait on a key a long holder has), some guards dropped without `release`, long holders
//! that renew, and a semaphore and a read-write lock beside them where the backend has
//! them. Every loop ends at the deadline; every await is bounded.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::{Lock, LockBackend, LockError, LockGuard, RwLock, Semaphore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};

use super::options::TrafficOptions;
use crate::worker::error_kind;

/// Permits of the soak's semaphore.
pub const SOAK_PERMITS: usize = 4;
/// Tasks on the semaphore and on the read-write lock (each, where the backend has them).
pub const SIDE_TASKS: usize = 2;

/// What the traffic did, counted as it goes.
#[derive(Debug, Default)]
pub struct Tally {
    /// Acquisition attempts, every kind.
    pub cycles: AtomicU64,
    /// Attempts that returned a guard or a permit.
    pub acquired: AtomicU64,
    /// Releases that returned `Ok`.
    pub released: AtomicU64,
    /// Guards dropped without `release`, on purpose.
    pub dropped: AtomicU64,
    /// Acquisitions cancelled by the caller's `timeout` while they waited.
    pub cancelled: AtomicU64,
    /// Acquisitions that waited their `wait` out (`Timeout`, `Busy`).
    pub timed_out: AtomicU64,
    /// Long holdings that dlock reported lost.
    pub lost: AtomicU64,
    /// Other errors, by `LockError` variant (or `release-timeout`).
    pub errors: Mutex<BTreeMap<String, u64>>,
    /// The first message of each error kind in `errors`, to tell what they were.
    pub first_errors: Mutex<BTreeMap<String, String>>,
    /// The kinds of task that ran (the semaphore and the read-write lock only where the
    /// backend has them).
    pub kinds: Mutex<Vec<&'static str>>,
}

impl Tally {
    fn error(&self, kind: String) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    fn lock_error(&self, error: &LockError) {
        let kind = error_kind(error);
        self.first_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind.clone())
            .or_insert_with(|| error.to_string());
        self.error(kind);
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn outcome(&self, error: &LockError) {
        match error {
            LockError::Timeout { .. } | LockError::Busy { .. } => Self::count(&self.timed_out),
            other => self.lock_error(other),
        }
    }
}

/// The long holders' keys: a cancelled acquisition waits on one of them.
fn long_key(i: usize) -> String {
    format!("soak:long{i}")
}

/// Starts the traffic on `backend` until `deadline`: the plain-lock tasks, the long
/// holders, and the semaphore and read-write tasks where the backend offers them.
/// Returns the tasks (join them after the deadline) and what they share.
pub fn start(
    backend: &Arc<dyn LockBackend>,
    options: &TrafficOptions,
    deadline: Instant,
) -> (JoinSet<()>, Arc<Tally>) {
    let tally = Arc::new(Tally::default());
    let mut tasks = JoinSet::new();
    for i in 0..options.tasks {
        let (b, o, t) = (Arc::clone(backend), options.clone(), Arc::clone(&tally));
        tasks.spawn(lock_task(b, o, t, deadline, i as u64));
    }
    for i in 0..options.long_holders {
        let (b, o, t) = (Arc::clone(backend), options.clone(), Arc::clone(&tally));
        tasks.spawn(long_holder(b, o, t, deadline, i));
    }
    // Read as the core reads them (`permits()`, `rw()`), whatever a
    // backend outside this crate answers in `capabilities()`.
    let semaphore = backend.permits().is_some();
    let rw = backend.rw().is_some();
    let mut kinds = vec!["plain locks"];
    if options.long_holders > 0 {
        kinds.push("long holders");
    }
    if semaphore {
        kinds.push("semaphore");
    }
    if rw {
        kinds.push("read-write lock");
    }
    *tally.kinds.lock().unwrap_or_else(|e| e.into_inner()) = kinds;
    for i in 0..SIDE_TASKS {
        if semaphore {
            let (b, o, t) = (Arc::clone(backend), options.clone(), Arc::clone(&tally));
            tasks.spawn(semaphore_task(b, o, t, deadline, 1000 + i as u64));
        }
        if rw {
            let (b, o, t) = (Arc::clone(backend), options.clone(), Arc::clone(&tally));
            tasks.spawn(rw_task(b, o, t, deadline, 2000 + i as u64));
        }
    }
    (tasks, tally)
}

/// A holding's short critical section: from half to one and a half of `--hold`.
fn short_hold(rng: &mut StdRng, options: &TrafficOptions) -> Duration {
    options.hold.mul_f64(rng.random_range(0.5..1.5))
}

fn one_in(rng: &mut StdRng, n: u32) -> bool {
    n > 0 && rng.random_ratio(1, n)
}

/// Releases `guard` (bounded by 4 ttl), or drops it 1 in `drop_one_in`.
async fn end(guard: LockGuard, rng: &mut StdRng, options: &TrafficOptions, tally: &Tally) {
    if one_in(rng, options.drop_one_in) {
        drop(guard);
        Tally::count(&tally.dropped);
        return;
    }
    match timeout(options.ttl * 4, guard.release()).await {
        Ok(Ok(())) => Tally::count(&tally.released),
        Ok(Err(LockError::NotHeld { .. })) => tally.error("NotHeld".into()),
        Ok(Err(e)) => tally.lock_error(&e),
        Err(_) => tally.error("release-timeout".into()),
    }
}

async fn lock_task(
    backend: Arc<dyn LockBackend>,
    options: TrafficOptions,
    tally: Arc<Tally>,
    deadline: Instant,
    id: u64,
) {
    let mut rng = StdRng::seed_from_u64(options.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while Instant::now() < deadline {
        Tally::count(&tally.cycles);
        let cancel = options.long_holders > 0 && one_in(&mut rng, options.cancel_one_in);
        let key = if cancel {
            long_key(rng.random_range(0..options.long_holders))
        } else {
            format!("soak:k{}", rng.random_range(0..options.keys))
        };
        let lock = Lock::new(key)
            .ttl(options.ttl)
            .wait(options.wait)
            .with_backend(Arc::clone(&backend));
        let acquired = if cancel {
            // gives up before the wait ends: the acquisition is dropped mid-wait
            let wait_ms = options.wait.as_millis().max(2) as u64;
            let patience = Duration::from_millis(rng.random_range(1..wait_ms));
            match timeout(patience, lock.acquire()).await {
                Ok(acquired) => acquired,
                Err(_) => {
                    Tally::count(&tally.cancelled);
                    continue;
                }
            }
        } else {
            // bounded by the lock's own wait; the outer bound only guards against a hang
            match timeout(options.wait + options.ttl * 4, lock.acquire()).await {
                Ok(acquired) => acquired,
                Err(_) => {
                    tally.error("acquire-hang".into());
                    continue;
                }
            }
        };
        match acquired {
            Ok(guard) => {
                Tally::count(&tally.acquired);
                tokio::time::sleep(short_hold(&mut rng, &options)).await;
                end(guard, &mut rng, &options, &tally).await;
            }
            Err(e) => {
                tally.outcome(&e);
                if !matches!(e, LockError::Timeout { .. } | LockError::Busy { .. }) {
                    // a server error: do not spin on it
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn long_holder(
    backend: Arc<dyn LockBackend>,
    options: TrafficOptions,
    tally: Arc<Tally>,
    deadline: Instant,
    i: usize,
) {
    let mut rng = StdRng::seed_from_u64(options.seed ^ (0x1000 + i as u64));
    while Instant::now() < deadline {
        Tally::count(&tally.cycles);
        let lock = Lock::new(long_key(i))
            .ttl(options.ttl)
            .wait(options.ttl)
            .with_backend(Arc::clone(&backend));
        let guard = match timeout(options.ttl * 5, lock.acquire()).await {
            Ok(Ok(guard)) => guard,
            Ok(Err(e)) => {
                tally.outcome(&e);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => {
                tally.error("acquire-hang".into());
                continue;
            }
        };
        Tally::count(&tally.acquired);
        let until = (Instant::now() + options.long_hold).min(deadline);
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            () = guard.lost() => Tally::count(&tally.lost),
        }
        end(guard, &mut rng, &options, &tally).await;
        // a moment free, so that a cancelled waiter sometimes gets it
        tokio::time::sleep(short_hold(&mut rng, &options)).await;
    }
}

async fn semaphore_task(
    backend: Arc<dyn LockBackend>,
    options: TrafficOptions,
    tally: Arc<Tally>,
    deadline: Instant,
    id: u64,
) {
    let mut rng = StdRng::seed_from_u64(options.seed ^ id);
    let semaphore = Semaphore::new("soak:sem", SOAK_PERMITS)
        .ttl(options.ttl)
        .wait(options.wait)
        .with_backend(Arc::clone(&backend));
    while Instant::now() < deadline {
        Tally::count(&tally.cycles);
        match timeout(options.wait + options.ttl * 4, semaphore.acquire()).await {
            Ok(Ok(permit)) => {
                Tally::count(&tally.acquired);
                tokio::time::sleep(short_hold(&mut rng, &options)).await;
                match timeout(options.ttl * 4, permit.release()).await {
                    Ok(Ok(())) => Tally::count(&tally.released),
                    Ok(Err(e)) => tally.lock_error(&e),
                    Err(_) => tally.error("release-timeout".into()),
                }
            }
            Ok(Err(e)) => {
                tally.outcome(&e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => tally.error("acquire-hang".into()),
        }
    }
}

async fn rw_task(
    backend: Arc<dyn LockBackend>,
    options: TrafficOptions,
    tally: Arc<Tally>,
    deadline: Instant,
    id: u64,
) {
    let mut rng = StdRng::seed_from_u64(options.seed ^ id);
    let rw = RwLock::new("soak:rw")
        .ttl(options.ttl)
        .wait(options.wait)
        .with_backend(Arc::clone(&backend));
    while Instant::now() < deadline {
        Tally::count(&tally.cycles);
        // mostly readers, one writer in five
        let taking = async {
            if rng.random_ratio(1, 5) {
                rw.write().await
            } else {
                rw.read().await
            }
        };
        match timeout(options.wait + options.ttl * 4, taking).await {
            Ok(Ok(guard)) => {
                Tally::count(&tally.acquired);
                tokio::time::sleep(short_hold(&mut rng, &options)).await;
                end(guard, &mut rng, &options, &tally).await;
            }
            Ok(Err(e)) => {
                tally.outcome(&e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => tally.error("acquire-hang".into()),
        }
    }
}
