//! A worker process's loop: take a lock (or a segment, or a permit), read-modify-write the
//! fenced store with its fence while holding it for about ttl/4 (sometimes past the ttl),
//! then release or drop it; every step reported as an [`Event`] on stdout.
//!
//! The worker uses dlock's public API only. It watches each holding's `lost()` in a task
//! of its own, so the report's time of loss is when dlock said so, not when the worker
//! next looked. Half of the rounds check `is_held()` before the write, as careful code
//! does; the other half write blindly and rely on the store's fencing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::{LockBackend, LockError, LockGuard, Permit, SegmentedLock, Semaphore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::clock::now_ns;
use crate::events::{Acquisition, EndHow, Event, HoldKind};
use crate::options::WorkerOptions;
use crate::store_client::{Opened, StoreClient};

/// The plain lock keys (`torture:k0` …), the segmented lock and the semaphore.
pub fn lock_key(i: usize) -> String {
    format!("torture:k{i}")
}
/// The segmented lock's key; its segments are `torture:seg#0` and `torture:seg#1`.
pub const SEGMENTED_KEY: &str = "torture:seg";
/// Segments of [`SEGMENTED_KEY`].
pub const SEGMENTS: usize = 2;
/// The semaphore's name.
pub const SEMAPHORE: &str = "torture:sem";
/// Permits of [`SEMAPHORE`].
pub const PERMITS: usize = 2;

fn emit(event: &Event) {
    // stdout is line buffered: one write per event, read by the run as it comes
    println!("{event}");
}

/// The `LockError` variant's name, for the report's errors by kind.
pub fn error_kind(error: &LockError) -> String {
    let debug = format!("{error:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("Unknown")
        .to_string()
}

enum Held {
    Guard(LockGuard),
    Permit(Permit),
}

impl Held {
    fn key(&self) -> &str {
        match self {
            Held::Guard(g) => g.key(),
            Held::Permit(p) => p.name(),
        }
    }
    fn fence(&self) -> Option<u64> {
        match self {
            Held::Guard(g) => g.fencing_token(),
            Held::Permit(_) => None,
        }
    }
    fn is_held(&self) -> bool {
        match self {
            Held::Guard(g) => g.is_held(),
            Held::Permit(p) => p.is_held(),
        }
    }
    fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let lost: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match self {
            Held::Guard(g) => Box::pin(g.lost()),
            Held::Permit(p) => Box::pin(p.lost()),
        };
        lost
    }
    async fn release(self) -> Result<(), LockError> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Permit(p) => p.release().await,
        }
    }
}

/// Runs the worker until `stop` is set (its stdin closed), finishing the round under way.
///
/// # Errors
/// The fenced store failed: without it nothing can be checked, so the worker stops.
pub async fn run(options: WorkerOptions, stop: Arc<AtomicBool>) -> Result<(), String> {
    let backend = loop {
        match dlock::connect(&options.url).await {
            Ok(backend) => break backend,
            Err(e) => {
                emit(&Event::Error {
                    op: "connect".into(),
                    kind: error_kind(&e),
                    t: now_ns(),
                });
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let name = format!("w{}.{}", options.id, options.incarnation);
    let mut store = StoreClient::connect(options.store, &name)
        .await
        .map_err(|e| format!("store at {}: {e}", options.store))?;
    emit(&Event::Ready { t: now_ns() });
    let mut rng = StdRng::seed_from_u64(
        options.seed
            ^ ((options.id as u64) << 32)
            ^ u64::from(options.incarnation).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    // semaphore rounds only where the backend has semaphores (the MySQL and file
    // backends have none yet: their `Semaphore` is refused)
    let semaphore = options.semaphore && backend.permits().is_some();
    let ttl = options.ttl;
    let wait = ttl * 4;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let pick = rng.random_range(0..100);
        let (kind, limit) = if pick < 70 || (pick >= 85 && !semaphore) {
            (HoldKind::Lock, 1)
        } else if pick < 85 {
            (HoldKind::Segment, 1)
        } else {
            (HoldKind::Permit, PERMITS)
        };
        let start = now_ns();
        let acquired = acquire(&backend, kind, &options, ttl, wait, &mut rng).await;
        let held = match acquired {
            Ok(held) => held,
            Err(e) => {
                emit(&Event::Error {
                    op: "acquire".into(),
                    kind: error_kind(&e),
                    t: now_ns(),
                });
                tokio::time::sleep(Duration::from_millis(rng.random_range(20..100))).await;
                continue;
            }
        };
        emit(&Event::Acquired(Acquisition {
            n,
            kind,
            key: held.key().to_string(),
            fence: held.fence(),
            start,
            returned: now_ns(),
        }));
        let lost = held.lost();
        let watcher = tokio::spawn(async move {
            lost.await;
            emit(&Event::Lost { n, t: now_ns() });
        });
        // Mostly ttl/8..3ttl/8 (around ttl/4); one round in seven past the ttl, which only
        // renewal keeps safe.
        let hold = if rng.random_range(0..7) == 0 {
            ttl.mul_f64(rng.random_range(1.1..1.6))
        } else {
            ttl.mul_f64(rng.random_range(0.125..0.375))
        };
        let careful = rng.random_bool(0.5);
        let written = write(&mut store, &held, limit, hold, careful).await;
        if let Err(e) = written {
            emit(&Event::Error {
                op: "store".into(),
                kind: "store".into(),
                t: now_ns(),
            });
            return Err(format!("store: {e}"));
        }
        let called = now_ns();
        let how = if rng.random_bool(0.8) {
            match held.release().await {
                Ok(()) => EndHow::Released,
                Err(LockError::NotHeld { .. }) => EndHow::NotHeld,
                Err(e) => {
                    emit(&Event::Error {
                        op: "release".into(),
                        kind: error_kind(&e),
                        t: now_ns(),
                    });
                    EndHow::ReleaseError
                }
            }
        } else {
            drop(held);
            EndHow::Dropped
        };
        emit(&Event::Ended {
            n,
            how,
            called,
            t: now_ns(),
        });
        // lost() never resolves after a release; a dropped guard's watcher is not needed
        watcher.abort();
    }
    Ok(())
}

async fn acquire(
    backend: &Arc<dyn LockBackend>,
    kind: HoldKind,
    options: &WorkerOptions,
    ttl: Duration,
    wait: Duration,
    rng: &mut StdRng,
) -> Result<Held, LockError> {
    match kind {
        HoldKind::Lock => {
            let key = lock_key(rng.random_range(0..options.keys));
            dlock::Lock::new(key)
                .ttl(ttl)
                .wait(wait)
                .with_backend(Arc::clone(backend))
                .acquire()
                .await
                .map(Held::Guard)
        }
        HoldKind::Segment => SegmentedLock::new(SEGMENTED_KEY, SEGMENTS)
            .ttl(ttl)
            .wait(wait)
            .with_backend(Arc::clone(backend))
            .acquire()
            .await
            .map(Held::Guard),
        HoldKind::Permit => Semaphore::new(SEMAPHORE, PERMITS)
            .ttl(ttl)
            .wait(wait)
            .with_backend(Arc::clone(backend))
            .acquire()
            .await
            .map(Held::Permit),
    }
}

async fn write(
    store: &mut StoreClient,
    held: &Held,
    limit: usize,
    hold: Duration,
    careful: bool,
) -> std::io::Result<()> {
    match store.begin(held.key(), held.fence(), limit).await? {
        Opened::Stale => Ok(()),
        Opened::Open { id, value } => {
            tokio::time::sleep(hold).await;
            if careful && !held.is_held() {
                store.abort(id).await
            } else {
                store.commit(id, value + 1).await.map(drop)
            }
        }
    }
}
