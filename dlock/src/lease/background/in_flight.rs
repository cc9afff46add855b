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
//!
//! The same count makes a program's end wait for it, with nothing for the
//! program to call: when work is handed over on the main thread (a guard
//! dropped as `main` returns, its release cut short by the runtime's end),
//! a thread-local of the main thread is set, and its destructor, which runs
//! as `main` returns and before the process exits, waits up to
//! [`AT_EXIT`] for the work in flight. Without it a hello world that
//! returned from `#[tokio::main]` holding a guard left the key on the
//! server until its ttl in 4 of 12 runs: the release went to dlock's
//! background thread, which the process's exit ended first. Other threads
//! are not held up at their exit (a runtime's workers, which end with it),
//! and a process ended by `std::process::exit` or a signal is not covered.

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
    settle_at_main_exit();
    async move {
        let out = task.await;
        drop(counted);
        out
    }
}

/// How long the end of `main` waits at most for the work in flight: a
/// release is one round trip; a server that does not answer by then
/// expires the lease by its ttl.
pub(crate) const AT_EXIT: Duration = Duration::from_secs(2);

/// Waits at the main thread's end for the work in flight (see the module
/// docs): its destructor is the wait.
struct SettleAtExit;

impl Drop for SettleAtExit {
    fn drop(&mut self) {
        let until = std::time::Instant::now() + AT_EXIT;
        // A plain poll: the work runs on other threads (dlock's runtime),
        // and this runs once, as the process ends.
        while count() > 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

thread_local! {
    static SETTLE_AT_EXIT: SettleAtExit = const { SettleAtExit };
}

/// Makes the main thread's end wait for the work in flight, if this runs
/// on the main thread.
fn settle_at_main_exit() {
    if std::thread::current().name() == Some("main") {
        // `try_with`: during the thread's own teardown there is nothing
        // left to arrange.
        let _ = SETTLE_AT_EXIT.try_with(|_| ());
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
