//! dlock's own runtime for work that must not depend on the caller's: the
//! watchdog (renewal and the lost-lease deadline), the releases of guards
//! whose runtime is gone, and every backend's connections, sessions and
//! subscribers (connected through [`run`], whatever runtime called
//! `connect`). The one exception: a Redis request made on a multi-thread
//! runtime, which drives its tasks whether or not the caller is polled,
//! goes on a connection of that runtime's own (`backends/redis/transport/lanes.rs`).
//!
//! Why a runtime of its own: a lease can be taken on any runtime, and a
//! runtime can stop being driven (an idle current-thread runtime, one that is
//! shutting down) while its leases live on. Renewal that ran there would stop
//! silently, `lost()` would stay quiet and another process would take the key.
//! The same holds for the task that drives a connection: a renewal written to
//! a connection whose driver sits on an idle runtime is never sent. One small
//! current-thread runtime on a thread of its own always runs.

//!
//! [`crate::shutdown`] ends it: [`close`] first (new acquisitions, inspections
//! and connections are refused with [`LockError::ShutDown`], while the
//! releases of held leases still run here), then [`stop`], which shuts the
//! runtime down (every task on it dropped: the watchdog, connections,
//! subscribers, sessions) and waits for its thread to exit.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use tokio::runtime::{Builder, Handle};
use tokio::sync::{oneshot, Notify};

use crate::LockError;

static BACKGROUND: LazyLock<Option<Background>> = LazyLock::new(start);

/// Set by [`close`]: nothing new may start (acquisitions, connections).
static CLOSED: AtomicBool = AtomicBool::new(false);
/// Set when the runtime is first asked for.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Set by [`stop`]: the runtime is gone or going; nothing runs on it.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// How long stopping waits for blocking tasks of the runtime (none of
/// dlock's own; a client library's DNS lookup, say) before leaving them.
const STOP_BLOCKING_WAIT: Duration = Duration::from_secs(1);

struct Background {
    /// Taken by [`stop`]: a `Handle` keeps the runtime's I/O driver handle,
    /// whose epoll and eventfd descriptors would otherwise stay open after
    /// `shutdown()` for as long as the process lives.
    handle: Mutex<Option<Handle>>,
    /// Ends the thread's `block_on`.
    stop: Mutex<Option<oneshot::Sender<()>>>,
    /// The thread, and the signal it sends once its runtime is shut down.
    thread: Mutex<Option<(std::thread::JoinHandle<()>, oneshot::Receiver<()>)>>,
}

thread_local! {
    /// Set on the thread `dlock-background`, which alone drives its runtime.
    static ON_BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

fn start() -> Option<Background> {
    STARTED.store(true, Ordering::SeqCst);
    let runtime = match Builder::new_current_thread()
        .enable_all()
        .thread_name("dlock-blocking")
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "dlock could not build its background runtime; leases are renewed on the runtime that took them");
            return None;
        }
    };
    let handle = runtime.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let (done, finished) = oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("dlock-background".into())
        // The thread lives until `dlock::shutdown` (or the process's end);
        // it holds no lock.
        .spawn(move || {
            ON_BACKGROUND.set(true);
            let _ = runtime.block_on(stopped);
            runtime.shutdown_timeout(STOP_BLOCKING_WAIT);
            let _ = done.send(());
        });
    match spawned {
        Ok(thread) => Some(Background {
            handle: Mutex::new(Some(handle)),
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some((thread, finished))),
        }),
        Err(e) => {
            tracing::error!(error = %e, "dlock could not start its background thread; leases are renewed on the runtime that took them");
            None
        }
    }
}

/// Acquisitions between their grant and their registration (or give-back).
static SETTLING: AtomicUsize = AtomicUsize::new(0);
static SETTLED: Notify = Notify::const_new();

/// Refuses what starts new work from now on (see [`check`]), and waits for
/// every acquisition that was between its grant and its registration: each
/// is registered (so `shutdown` finds its lease) or given back by then.
pub(crate) async fn close() {
    CLOSED.store(true, Ordering::SeqCst);
    loop {
        let settled = SETTLED.notified();
        if SETTLING.load(Ordering::SeqCst) == 0 {
            return;
        }
        settled.await;
    }
}

/// Held by an acquisition from its grant until its lease is registered or
/// given back; [`Settling::closed`] tells it which. (`SETTLING` is raised
/// before `CLOSED` is read, and `close` sets `CLOSED` before it reads
/// `SETTLING`: one of the two sees the other.)
pub(crate) struct Settling(());

impl Settling {
    pub(crate) fn enter() -> Self {
        SETTLING.fetch_add(1, Ordering::SeqCst);
        Settling(())
    }

    /// Whether `shutdown` began: give the lease back instead of registering.
    pub(crate) fn closed(&self) -> bool {
        CLOSED.load(Ordering::SeqCst)
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        if SETTLING.fetch_sub(1, Ordering::SeqCst) == 1 {
            SETTLED.notify_waiters();
        }
    }
}

/// `Err(`[`LockError::ShutDown`]`)` once [`crate::shutdown`] has begun: the
/// check of every acquisition, inspection, listing, extension and connect.
pub(crate) fn check() -> Result<(), LockError> {
    if CLOSED.load(Ordering::SeqCst) {
        Err(LockError::ShutDown)
    } else {
        Ok(())
    }
}

/// What ends with dlock besides its runtime: threads of a backend's own
/// (the file backend's inotify reader), registered by the backend that
/// starts them, which sits above this floor.
static AT_STOP: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Has `hook` run by [`stop`] (`dlock::shutdown`): register it once.
#[cfg(all(feature = "file", target_os = "linux"))]
pub(crate) fn at_stop(hook: fn()) {
    lock(&AT_STOP).push(hook);
}

/// Shuts the background runtime down (its tasks dropped, each at its next
/// `.await`) and waits until its thread has exited. Called on the
/// background runtime itself (which cannot wait for its own end), it only
/// asks for the stop. A second call does nothing.
pub(crate) async fn stop() {
    CLOSED.store(true, Ordering::SeqCst);
    STOPPED.store(true, Ordering::SeqCst);
    for hook in std::mem::take(&mut *lock(&AT_STOP)) {
        hook();
    }
    // A runtime never started is not started now.
    if !STARTED.load(Ordering::SeqCst) {
        return;
    }
    let Some(background) = &*BACKGROUND else {
        return;
    };
    if let Some(stop) = lock(&background.stop).take() {
        let _ = stop.send(());
    }
    if is_current() {
        return;
    }
    let Some((thread, finished)) = lock(&background.thread).take() else {
        return;
    };
    // The thread signals after its runtime is shut down, then returns:
    // the join waits for that return only.
    let _ = finished.await;
    let _ = thread.join();
    // The runtime is gone; its descriptors close with the last handle.
    drop(lock(&background.handle).take());
}

/// A handle of the background runtime while it runs (`None` once stopped).
fn running() -> Option<Handle> {
    BACKGROUND.as_ref().and_then(|b| lock(&b.handle).clone())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `task` on dlock's background runtime or, if that could not be
/// started, on the caller's runtime. Never panics: outside any runtime and
/// without the background one, `task` is dropped unrun.
///
/// The task is *in flight* until it ends or is dropped: [`crate::shutdown`]
/// waits for it (bounded, see [`in_flight::settle`]) before it stops the
/// runtime, so work handed off by a drop (leaving a waiter queue, releasing
/// a dropped guard) is done before the process exits. A task that lives as
/// long as a backend or a lease goes through [`spawn_daemon`] instead.
///
/// After [`crate::shutdown`] stopped the runtime, `task` is dropped unrun.
pub(crate) fn spawn<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    spawn_daemon(in_flight::tracked(task));
}

/// [`spawn`] for a task that lives as long as what started it (the
/// watchdog, a backend's watcher, a reaper): `shutdown` does not wait for
/// it, it is dropped with the runtime.
pub(crate) fn spawn_daemon<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if STOPPED.load(Ordering::SeqCst) {
        return;
    }
    if BACKGROUND.is_some() {
        // Stopped meanwhile: dropped unrun, as above.
        if let Some(handle) = running() {
            drop(handle.spawn(task));
        }
    } else if let Ok(handle) = Handle::try_current() {
        drop(handle.spawn(task));
    }
}

/// dlock's background runtime, if it could be started: `Err` once
/// [`crate::shutdown`] has begun.
pub(crate) fn handle() -> Result<Option<Handle>, LockError> {
    check()?;
    Ok(running())
}

/// Whether the running code is on dlock's background runtime (its thread
/// is the only one that runs it): there, work meant for that runtime can
/// run in place.
pub(crate) fn is_current() -> bool {
    ON_BACKGROUND.get()
}

pub(crate) mod in_flight;
// Empty without a backend that connects to a server (its `#![cfg]`).
mod run;
#[cfg(server_backend)]
pub(crate) use run::run;
