//! `dlock::shutdown`: give back every lease this process holds, for a
//! SIGTERM handler.

use std::sync::Arc;

use crate::lease::LeaseShared;

/// Releases every lease this process holds (locks, segments, permits, read
/// and write leases, on every backend) and stops renewing them; returns how
/// many it released.
///
/// - Each lease is released by compare-and-delete, all at once, and this
///   future ends when every answer is in (a lease whose service does not
///   answer expires by its ttl).
/// - Guards of these leases stay valid objects: [`is_held`](crate::LockGuard::is_held)
///   is false, dropping one does nothing, and `release()` answers
///   [`NotHeld`](crate::LockError::NotHeld). Their `lost()` does not fire: the
///   leases were given back, not lost.
/// - Leases taken after the call are held and renewed as usual.
/// - One `dlock.operation` span (`op = "shutdown"`) and `dlock_operations_total`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://").await?;
/// let guard = dlock::Lock::new("job").with_backend(backend.clone()).acquire().await?;
/// // in the SIGTERM handler:
/// dlock::shutdown().await;
/// assert!(!guard.is_held());
/// assert!(dlock::Lock::new("job").with_backend(backend).try_acquire().await?.is_some());
/// drop(guard); // does nothing
/// # Ok(()) }
/// ```
pub async fn shutdown() -> usize {
    let span = tracing::debug_span!(
        "dlock.operation",
        op = "shutdown",
        released = tracing::field::Empty
    );
    let leases: Vec<Arc<LeaseShared>> = crate::local::all()
        .iter()
        .flat_map(|local| local.watchdog.take_all())
        .collect();
    let mut releases = tokio::task::JoinSet::new();
    for lease in leases {
        if let Ok(was_held) = lease.begin_release() {
            releases.spawn(async move { lease.finish_release(was_held).await.is_ok() });
        }
    }
    let mut released = 0;
    while let Some(done) = releases.join_next().await {
        released += usize::from(matches!(done, Ok(true)));
    }
    span.record("released", released);
    crate::inspect::count("shutdown", "all", "released");
    released
}
