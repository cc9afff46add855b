//! dlock's own runtime for work that must not depend on the caller's: the
//! watchdog (renewal and the lost-lease deadline) and the releases of guards
//! whose runtime is gone.
//!
//! Why a runtime of its own: a lease can be taken on any runtime, and a
//! runtime can stop being driven (an idle current-thread runtime, one that is
//! shutting down) while its leases live on. Renewal that ran there would stop
//! silently, `lost()` would stay quiet and another process would take the key.
//! One small current-thread runtime on a thread of its own always runs.

use std::future::Future;
use std::sync::LazyLock;

use tokio::runtime::{Builder, Handle};

static BACKGROUND: LazyLock<Option<Handle>> = LazyLock::new(start);

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
        .spawn(move || runtime.block_on(std::future::pending::<()>()));
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
