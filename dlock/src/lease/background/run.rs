//! [`run`]: a task of a backend's connection, moved onto dlock's
//! background runtime and awaited there; only the backends that connect to
//! a server have such tasks.
#![cfg(server_backend)]

use std::future::Future;
use std::sync::atomic::Ordering;

use super::{is_current, BACKGROUND, STOPPED};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::LockError;

/// What [`run`] answers for a task that cannot run because dlock was shut
/// down: the task's own kind of error.
pub(crate) trait ShutDownOutput {
    /// The output that says dlock was shut down.
    fn shut_down() -> Self;
}

/// The text of a client library's error for work refused after shutdown.
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) const SHUT_DOWN: &str =
    "dlock was shut down (`dlock::shutdown()`): its background runtime, where connections live, is stopped";

#[cfg(feature = "redis")]
impl<T> ShutDownOutput for redis::RedisResult<T> {
    fn shut_down() -> Self {
        Err(redis::RedisError::from((redis::ErrorKind::Io, SHUT_DOWN)))
    }
}

#[cfg(feature = "etcd")]
impl<T> ShutDownOutput for Result<T, etcd_client::Error> {
    fn shut_down() -> Self {
        Err(etcd_client::Error::IoError(std::io::Error::other(
            SHUT_DOWN,
        )))
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<T> ShutDownOutput for Result<T, LockError> {
    fn shut_down() -> Self {
        Err(LockError::ShutDown)
    }
}

impl<T> ShutDownOutput for Option<T> {
    fn shut_down() -> Self {
        None
    }
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
/// - After [`crate::shutdown`] stopped the runtime (or while it stops it,
///   cancelling `task`), the output is [`ShutDownOutput::shut_down`].
pub(crate) async fn run<F>(task: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: ShutDownOutput + Send + 'static,
{
    if STOPPED.load(Ordering::SeqCst) {
        return F::Output::shut_down();
    }
    if BACKGROUND.is_none() || is_current() {
        return task.await;
    }
    let Some(handle) = super::running() else {
        return F::Output::shut_down();
    };
    let mut running = AbortOnDrop(handle.spawn(task));
    match (&mut running.0).await {
        Ok(out) => out,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only an abort (ours happens when this future is dropped, so
            // it is never seen here) or the runtime's shutdown cancels a
            // task.
            Err(_) => F::Output::shut_down(),
        },
    }
}

/// Aborts the task when the future waiting for it is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(all(test, any(feature = "redis", feature = "etcd", feature = "zookeeper")))]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn run_moves_the_task_to_the_background_thread_and_back() {
        assert!(!is_current());
        let name = run(async { Some(std::thread::current().name().map(str::to_owned)) }).await;
        assert_eq!(name.flatten().as_deref(), Some("dlock-background"));
        // From the background thread itself, in place.
        let nested = run(async { run(async { Some(is_current()) }).await }).await;
        assert_eq!(nested, Some(true));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_in_the_task_reaches_the_caller() {
        let caught = tokio::spawn(run(async { panic!("boom") as Option<()> })).await;
        let panic = caught.unwrap_err().into_panic();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"boom"));
    }
}
