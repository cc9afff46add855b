//! `dlock::shutdown`: give back every lease this process holds and stop
//! dlock's background runtime, for a SIGTERM handler.
//!
//! The order: `background::close` (later calls get `LockError::ShutDown`;
//! grants between the server's answer and their registration settle first,
//! `background::Settling`); every backend's watchdog gives up its leases
//! (`local::all`, `Watchdog::take_all`), each released; background work in
//! flight is waited for (at most 1 s, `in_flight::settle`); then
//! `background::stop` shuts the runtime down and joins its thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use crate::lease::held::LeaseShared;

/// How long [`shutdown`] waits for background work still in flight.
const SETTLE_LIMIT: Duration = Duration::from_secs(1);

/// Releases every lease this process holds (locks, segments, permits, read
/// and write leases, on every backend), then stops dlock's background
/// runtime; returns how many leases it released. The last dlock call of a
/// process that is about to exit (a SIGTERM handler).
///
/// - From the call on, dlock takes nothing new: every acquisition
///   (`acquire`, `try_acquire`, the blocking API, the attribute),
///   [`Lock::inspect`](crate::Lock::inspect),
///   [`force_release`](crate::Lock::force_release),
///   [`list_locks`](crate::list_locks),
///   [`extend`](crate::LockGuard::extend) and [`connect`](crate::connect)
///   fail fast with [`LockError::ShutDown`](crate::LockError::ShutDown), in
///   this and every later call. An acquisition already waiting that is
///   granted meanwhile gives its lease back and answers `ShutDown` too.
/// - Each held lease is released by compare-and-delete, all at once, and the
///   releases are awaited (a lease whose service does not answer expires by
///   its ttl). A lease whose guard was already released but that is kept on
///   the server until its [`hold_at_least`](crate::Lock::hold_at_least) is
///   left to expire by its ttl.
/// - Then it waits, at most 1 s, for the work dlock handed to its
///   background runtime that is still in flight: a waiter's departure from
///   its queue (Redis, etcd, ZooKeeper) after its acquisition was dropped or
///   timed out, the release of a guard dropped without `release()`, the
///   clean-up of an abandoned acquisition. So a process that gives up
///   waiting and then calls `shutdown` leaves no stale queue ticket behind
///   it. Work that needs longer (an unreachable service) is dropped with
///   the runtime; its ticket or lease expires on the server.
/// - Then the background runtime is shut down: the watchdog, every backend's
///   connections, sessions and subscribers are dropped, and this future ends
///   once the thread `dlock-background` has exited. No dlock thread is left.
///   A Redis connection a multi-thread runtime of yours opened for its own
///   requests (its lane) is no longer used, and closes when that runtime or
///   the backend is dropped.
/// - Guards of the released leases stay valid objects:
///   [`is_held`](crate::LockGuard::is_held) is false, dropping one does
///   nothing, and `release()` answers [`NotHeld`](crate::LockError::NotHeld).
///   Their `lost()` does not fire: the leases were given back, not lost.
/// - Calling it again does nothing and returns 0. Never panics.
/// - One `dlock.operation` span (`op = "shutdown"`) and `dlock_operations_total`.
///
/// # Cancel safety
/// Dropping the future before it ends leaves dlock shut down (nothing new
/// is taken) with the releases sent so far; the runtime keeps running
/// until the process exits.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://").await?;
/// let guard = dlock::Lock::new("job").with_backend(backend.clone()).acquire().await?;
/// // in the SIGTERM handler:
/// assert_eq!(dlock::shutdown().await, 1);
/// assert!(!guard.is_held());
/// drop(guard); // does nothing
/// // dlock takes nothing after it:
/// let late = dlock::Lock::new("job").with_backend(backend).try_acquire().await;
/// assert!(matches!(late, Err(dlock::LockError::ShutDown)));
/// # Ok(()) }
/// ```
pub async fn shutdown() -> usize {
    let span = tracing::debug_span!(
        "dlock.operation",
        op = "shutdown",
        released = tracing::field::Empty
    );
    crate::lease::background::close().await;
    let leases: Vec<Arc<LeaseShared>> = crate::lease::local::all()
        .iter()
        .flat_map(|local| local.watchdog.take_all())
        .collect();
    // Polled here, not spawned: the caller may be on any executor.
    let mut releases: Vec<Pin<Box<dyn Future<Output = bool> + Send>>> = leases
        .into_iter()
        .filter_map(|lease| {
            let was_held = lease.begin_release().ok()?;
            let release: Pin<Box<dyn Future<Output = bool> + Send>> =
                Box::pin(async move { lease.finish_release(was_held).await.is_ok() });
            Some(release)
        })
        .collect();
    let mut released = 0;
    std::future::poll_fn(|cx| {
        releases.retain_mut(|release| match release.as_mut().poll(cx) {
            Poll::Ready(ok) => {
                released += usize::from(ok);
                false
            }
            Poll::Pending => true,
        });
        if releases.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    // What drops handed to the background (queue departures, releases of
    // dropped guards and abandoned acquisitions) is done before the
    // runtime goes; a service that does not answer costs at most this.
    if !crate::lease::background::in_flight::settle(SETTLE_LIMIT).await {
        tracing::debug!(
            in_flight = crate::lease::background::in_flight::count(),
            "dlock::shutdown stopped waiting for background work; what is left ends with the runtime"
        );
    }
    crate::lease::background::stop().await;
    span.record("released", released);
    crate::lease::observe::operation::count("shutdown", "all", "released");
    released
}
