//! Background work in flight: the tasks [`super::spawn`] started that have
//! not ended yet, counted so that [`crate::shutdown`] can wait for them
//! before it stops the runtime.
//!
//! Most of them are handed off by a `Drop` (a waiter leaving its queue, a
//! dropped guard's release, an abandoned acquisition's clean-up): the
//! dropping code cannot await, so without this a process that exits right
//! after the drop (a CLI that gave up waiting, a SIGTERM handler) exits
//! before the work runs, and the server keeps a stale ticket or lease until
//! it expires.
//!
//! A task counts from the moment it is handed over (not from its first
//! poll) until it ends or is dropped unrun, whichever comes first.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Tasks handed over and not ended.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Woken when [`IN_FLIGHT`] drops to zero.
static SETTLED: Notify = Notify::const_new();

/// Counts one task in flight while it lives.
struct InFlight(());

impl InFlight {
    fn enter() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if IN_FLIGHT.fetch_sub(1, Ordering::SeqCst) == 1 {
            SETTLED.notify_waiters();
        }
    }
}

/// `task`, counted in flight from now until it ends or is dropped: for a
/// task spawned on a runtime other than dlock's background one (a
/// ZooKeeper session's, the runtime a dropped guard was taken on).
pub(crate) fn tracked<F>(task: F) -> impl Future<Output = F::Output> + Send + 'static
where
    F: Future + Send + 'static,
{
    let counted = InFlight::enter();
    async move {
        let out = task.await;
        drop(counted);
        out
    }
}

/// How many tasks are in flight.
pub(crate) fn count() -> usize {
    IN_FLIGHT.load(Ordering::SeqCst)
}

/// Waits until no task is in flight, or `limit` passed; whether none is
/// left. Tasks started meanwhile are waited for too. Works on any executor:
/// the timer runs where the tasks run (dlock's background runtime, or the
/// caller's tokio runtime); where neither runs, it is dropped unrun and the
/// wait ends at once, as nothing in flight could run either.
pub(crate) async fn settle(limit: Duration) -> bool {
    if count() == 0 {
        return true;
    }
    let (expire, expired) = tokio::sync::oneshot::channel::<()>();
    let timer = async move {
        tokio::time::sleep(limit).await;
        let _ = expire.send(());
    };
    // Where the tasks run; dropped unrun if they cannot run either.
    super::spawn_daemon(timer);
    let waiting = async {
        loop {
            let settled = SETTLED.notified();
            if count() == 0 {
                return;
            }
            settled.await;
        }
    };
    tokio::select! {
        biased;
        () = waiting => true,
        // A timer dropped unrun (the runtime stopping) ends the wait too.
        _ = expired => count() == 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn settle_waits_for_a_task_and_gives_up_at_its_limit() {
        // Other tests of this binary spawn too: measure against a baseline.
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let task = tracked(async move {
            let _ = released.await;
        });
        assert!(count() >= 1);
        let running = tokio::spawn(task);
        let start = std::time::Instant::now();
        let settled = settle(Duration::from_millis(100)).await;
        assert!(!settled, "a task in flight was not waited for");
        assert!(start.elapsed() >= Duration::from_millis(100));
        drop(release);
        running.await.unwrap();
    }
}
