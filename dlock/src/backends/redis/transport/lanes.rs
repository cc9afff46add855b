//! Lanes: which connection a request goes on, decided by where it is made.
//!
//! Why: a request handed to dlock's background thread and back costs two
//! cross-thread wake-ups and a task (measured with `profile`: about 2 µs of
//! client CPU per request, a third of an uncontended cycle). On a
//! multi-thread tokio runtime that hand-over buys nothing: its workers drive
//! the tasks spawned on it for as long as the runtime exists, whether or not
//! the caller's own task is polled. So a request made on such a runtime goes
//! on a connection whose driver lives on that runtime (its *lane*), made
//! lazily the first time that runtime asks. Everywhere else (a current-thread
//! runtime, which runs only while someone blocks on it; no runtime; dlock's
//! background thread itself, where the watchdog renews) the request takes
//! the background lane, as before.
//!
//! What must stay on one connection stays in one lane: everything that
//! relies on Redis answering one connection's requests in order (a release
//! queued behind its acquire, a `WAIT` covering the grants before it, a
//! local hand-off's acquire right behind the release) is either made in the
//! same lane as what it follows, or runs in a task that [`following`] the
//! lane it was started from (the release of an acquisition dropped mid-way,
//! the `WAIT`s of a lane's grants, Redlock's deletes): such a task uses the
//! lane it follows wherever it runs, as long as that lane is alive.
//!
//! A lane lives as long as its runtime: a task parked on the runtime holds
//! a guard that removes the lane when the runtime drops its tasks (its
//! shutdown), so a program that makes runtimes one after another keeps no
//! dead lane.

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use tokio::runtime::{Handle, Id, RuntimeFlavor};

tokio::task_local! {
    /// Set by [`following`]: the lane a task started elsewhere uses.
    static FOLLOWING: Option<Id>;
}

/// The lane of the code running now: the id of the multi-thread runtime it
/// runs on (or whose lane the task [`following`]), `None` for the
/// background lane.
pub(crate) fn here() -> Option<Id> {
    if let Ok(followed) = FOLLOWING.try_with(|lane| *lane) {
        return followed;
    }
    current_runtime().map(|(id, _)| id)
}

/// Whether the running task [`following`] a lane (rather than taking the
/// lane of where it runs).
pub(crate) fn is_following() -> bool {
    FOLLOWING.try_with(|_| ()).is_ok()
}

/// `task`, made to use the lane of the code that calls this (not the lane
/// of wherever it is polled): for work that must reach the server on the
/// same connection as the requests before it.
pub(crate) fn following<F: Future>(task: F) -> impl Future<Output = F::Output> {
    FOLLOWING.scope(here(), task)
}

/// Runs `task` on dlock's background runtime (see
/// [`crate::lease::background::spawn`]) in the lane of the code that calls
/// this: the work a dropped request leaves behind (its release, its queue
/// ticket's removal), which must reach the server behind that request.
pub(crate) fn spawn_following<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    crate::lease::background::spawn(following(task));
}

/// Runs `task` in the lane of the code that calls this, as
/// [`spawn_following`] does, but on the lane's own runtime when the caller
/// runs on it: a multi-thread runtime drives it whether or not the caller
/// is polled, and no thread is woken for it. For work whose requests only
/// await answers already on their way (the deletes a Redlock release did
/// not wait for).
#[cfg(feature = "redlock")]
pub(crate) fn spawn_in_lane<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match current_runtime() {
        Some((_, handle)) if !is_following() => {
            drop(handle.spawn(crate::lease::background::in_flight::tracked(task)));
        }
        _ => spawn_following(task),
    }
}

/// The multi-thread runtime running this code, if any, and not on dlock's
/// background thread.
fn current_runtime() -> Option<(Id, Handle)> {
    if crate::lease::background::is_current() {
        return None;
    }
    let handle = Handle::try_current().ok()?;
    (handle.runtime_flavor() == RuntimeFlavor::MultiThread).then(|| (handle.id(), handle))
}

/// The lanes' values, by runtime.
type Entries<T> = Mutex<Vec<(Id, Arc<T>)>>;

/// One `T` per lane of a multi-thread runtime, made at the runtime's first
/// use and dropped when the runtime ends.
pub(crate) struct PerRuntime<T> {
    entries: Arc<Entries<T>>,
}

impl<T> std::fmt::Debug for PerRuntime<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerRuntime")
            .field("lanes", &lock(&self.entries).len())
            .finish()
    }
}

impl<T> Default for PerRuntime<T> {
    fn default() -> Self {
        PerRuntime {
            entries: Arc::default(),
        }
    }
}

impl<T: Send + Sync + 'static> PerRuntime<T> {
    /// The `T` of the lane [`here`]: `None` for the background lane, and for
    /// a followed lane whose runtime is gone. Made with `make` (given the
    /// runtime's handle) when the runtime running this code asks first.
    pub(crate) fn here(&self, make: impl FnOnce(&Handle) -> T) -> Option<Arc<T>> {
        if let Ok(followed) = FOLLOWING.try_with(|lane| *lane) {
            // Only looked up: a lane is made on its own runtime.
            let id = followed?;
            return self.find(id);
        }
        let (id, handle) = current_runtime()?;
        if let Some(found) = self.find(id) {
            return Some(found);
        }
        let made = Arc::new(make(&handle));
        let mut entries = lock(&self.entries);
        if let Some((_, raced)) = entries.iter().find(|(e, _)| *e == id) {
            return Some(raced.clone());
        }
        entries.push((id, made.clone()));
        drop(entries);
        // Parked on the runtime until its shutdown drops it.
        let remove = RemoveOnDrop {
            entries: Arc::downgrade(&self.entries),
            id,
        };
        drop(handle.spawn(async move {
            let _remove = remove;
            std::future::pending::<()>().await;
        }));
        Some(made)
    }

    fn find(&self, id: Id) -> Option<Arc<T>> {
        lock(&self.entries)
            .iter()
            .find(|(e, _)| *e == id)
            .map(|(_, t)| t.clone())
    }

    /// Every lane's `T` now.
    #[cfg(any(test, feature = "redlock"))]
    pub(crate) fn all(&self) -> Vec<Arc<T>> {
        lock(&self.entries).iter().map(|(_, t)| t.clone()).collect()
    }
}

/// Removes a lane when its runtime drops the task that holds this.
struct RemoveOnDrop<T> {
    entries: Weak<Entries<T>>,
    id: Id,
}

impl<T> Drop for RemoveOnDrop<T> {
    fn drop(&mut self) {
        if let Some(entries) = self.entries.upgrade() {
            // Dropped outside the lock: a lane's drop may close a connection.
            let removed = {
                let mut entries = lock(&entries);
                let at = entries.iter().position(|(e, _)| *e == self.id);
                at.map(|at| entries.swap_remove(at))
            };
            drop(removed);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update is a push or a removal: a poisoned mutex still guards
    // consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_multi_thread_runtime_has_a_lane_of_its_own_and_loses_it_at_its_end() {
        let lanes: Arc<PerRuntime<u32>> = Arc::default();
        let (a, b) = (multi_thread(), multi_thread());
        let in_a = a.block_on(async { lanes.here(|_| 1) });
        let again = a.block_on(async { lanes.here(|_| 9) });
        let in_b = b.block_on(async { lanes.here(|_| 2) });
        assert_eq!(
            (in_a.as_deref(), again.as_deref(), in_b.as_deref()),
            (Some(&1), Some(&1), Some(&2))
        );
        assert_eq!(lanes.all().len(), 2);
        drop(a);
        assert_eq!(lanes.all().iter().map(|t| **t).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn current_thread_runtimes_and_plain_threads_take_the_background_lane() {
        let lanes: PerRuntime<u32> = PerRuntime::default();
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(current.block_on(async { lanes.here(|_| 1) }).is_none());
        assert!(lanes.here(|_| 1).is_none());
        assert!(here().is_none());
    }

    #[test]
    fn a_task_following_a_lane_uses_it_elsewhere() {
        let lanes: Arc<PerRuntime<u32>> = Arc::default();
        let a = multi_thread();
        let (lane, follower) = a.block_on(async {
            let lane = lanes.here(|_| 7);
            let lanes = lanes.clone();
            (lane, following(async move { (here(), lanes.here(|_| 8)) }))
        });
        // Polled on another runtime (here: none), it still takes `a`'s lane.
        let (id, found) = futures_util::FutureExt::now_or_never(follower).unwrap();
        assert_eq!(id, Some(a.handle().id()));
        assert_eq!(found.as_deref(), lane.as_deref());
        drop(a);
        // A followed lane whose runtime is gone is not made again.
        let lanes2 = lanes.clone();
        let late = futures_util::FutureExt::now_or_never(
            FOLLOWING.scope(id, async move { lanes2.here(|_| 9) }),
        );
        assert_eq!(late, Some(None));
    }
}
