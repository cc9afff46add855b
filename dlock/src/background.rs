//! dlock's own runtime for work that must not depend on the caller's: the
//! watchdog (renewal and the lost-lease deadline), the releases of guards
//! whose runtime is gone, and every backend's connections, sessions and
//! subscribers (connected through [`run`], whatever runtime called
//! `connect`).
//!
//! Why a runtime of its own: a lease can be taken on any runtime, and a
//! runtime can stop being driven (an idle current-thread runtime, one that is
//! shutting down) while its leases live on. Renewal that ran there would stop
//! silently, `lost()` would stay quiet and another process would take the key.
//! The same holds for the task that drives a connection: a renewal written to
//! a connection whose driver sits on an idle runtime is never sent. One small
//! current-thread runtime on a thread of its own always runs.

use std::cell::Cell;
use std::future::Future;
use std::sync::LazyLock;

use tokio::runtime::{Builder, Handle};

static BACKGROUND: LazyLock<Option<Handle>> = LazyLock::new(start);

thread_local! {
    /// Set on the thread `dlock-background`, which alone drives its runtime.
    static ON_BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

fn start() -> Option<Handle> {
    let runtime = match Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "dlock could not build its background runtime; leases are renewed on the runtime that took them");
            return None;
        }
    };
    let handle = runtime.handle().clone();
    let spawned = std::thread::Builder::new()
        .name("dlock-background".into())
        // The thread lives as long as the process; it holds no lock and owns
        // nothing that needs an orderly shutdown.
        .spawn(move || {
            ON_BACKGROUND.set(true);
            runtime.block_on(std::future::pending::<()>())
        });
    match spawned {
        Ok(_) => Some(handle),
        Err(e) => {
            tracing::error!(error = %e, "dlock could not start its background thread; leases are renewed on the runtime that took them");
            None
        }
    }
}

/// Runs `task` on dlock's background runtime or, if that could not be
/// started, on the caller's runtime. Never panics: outside any runtime and
/// without the background one, `task` is dropped unrun.
pub(crate) fn spawn<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Some(handle) = &*BACKGROUND {
        drop(handle.spawn(task));
    } else if let Ok(handle) = Handle::try_current() {
        drop(handle.spawn(task));
    }
}

/// dlock's background runtime, if it could be started.
pub(crate) fn handle() -> Option<&'static Handle> {
    BACKGROUND.as_ref()
}

/// Whether the running code is on dlock's background runtime (its thread
/// is the only one that runs it): there, work meant for that runtime can
/// run in place.
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub(crate) fn is_current() -> bool {
    ON_BACKGROUND.get()
}

/// Runs `task` on dlock's background runtime and returns its output, so
/// that whatever it spawns (a connection's driver, a session's task) and
/// every socket it opens live on that runtime, not on the caller's.
///
/// - On the background runtime already, or if that could not be started,
///   `task` runs in place, in the caller's task.
/// - A panic in `task` is resumed in the caller.
/// - Dropping the returned future aborts `task` (it stops at its next
///   `.await`), as dropping `task` itself would.
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub(crate) async fn run<F>(task: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handle = match &*BACKGROUND {
        Some(handle) if !is_current() => handle,
        _ => return task.await,
    };
    let mut running = AbortOnDrop(handle.spawn(task));
    match (&mut running.0).await {
        Ok(out) => out,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only an abort (ours happens when this future is dropped, so
            // it is never seen here) or a runtime shutdown cancels a task;
            // the background runtime is never shut down.
            Err(e) => unreachable!("dlock's background runtime cancelled a task: {e}"),
        },
    }
}

/// Aborts the task when the future waiting for it is dropped.
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn run_moves_the_task_to_the_background_thread_and_back() {
        assert!(!is_current());
        let name = run(async { std::thread::current().name().map(str::to_owned) }).await;
        assert_eq!(name.as_deref(), Some("dlock-background"));
        // From the background thread itself, in place.
        let nested = run(async { run(async { is_current() }).await }).await;
        assert!(nested);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_in_the_task_reaches_the_caller() {
        let caught = tokio::spawn(run(async { panic!("boom") })).await;
        let panic = caught.unwrap_err().into_panic();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"boom"));
    }
}
