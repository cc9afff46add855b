//! Reentrancy: which held leases the running code is inside of.
//!
//! Reentrancy follows the holder's critical section, not the tokio task: a
//! future run by [`LockGuard::scope`](crate::LockGuard::scope) (and the body
//! of a `#[distributed_lock]` function, which runs that way) carries its
//! lease in a task-local frame, and an acquire of the same key on the same
//! backend made *inside* that future re-enters. Code that is not nested in
//! the holder's future sees no frame and contends as any other caller:
//! other tasks, and the sibling branches of a `join!`, `select!` or
//! `FuturesUnordered` in the holder's own task, because a task-local scope
//! is in force only while its own future is being polled.

use std::future::Future;
use std::sync::Arc;

use crate::backend::LockBackend;
use crate::lease::held::{LeaseKind, LeaseShared};

/// One held lease whose critical section the code runs in, and the frames
/// it is nested in.
struct Frame {
    lease: Arc<LeaseShared>,
    outer: Option<Arc<Frame>>,
}

tokio::task_local! {
    static INSIDE: Option<Arc<Frame>>;
}

/// The held lock lease on `key` of `backend` whose critical section the
/// running code is inside of, if any.
pub(crate) fn enclosing(backend: &Arc<dyn LockBackend>, key: &str) -> Option<Arc<LeaseShared>> {
    innermost(backend, key, |kind| kind == LeaseKind::Lock)
}

/// The held read or write lease on the read-write lock `key` of `backend`
/// whose critical section the running code is inside of, if any (a plain
/// lock of the same key is another object and does not count).
pub(crate) fn enclosing_rw(backend: &Arc<dyn LockBackend>, key: &str) -> Option<Arc<LeaseShared>> {
    innermost(backend, key, |kind| matches!(kind, LeaseKind::Rw(_)))
}

/// The innermost held lease on `key` of `backend` whose kind `kind_fits`.
fn innermost(
    backend: &Arc<dyn LockBackend>,
    key: &str,
    kind_fits: impl Fn(LeaseKind) -> bool,
) -> Option<Arc<LeaseShared>> {
    INSIDE
        .try_with(|top| {
            let mut frame = top.as_ref();
            while let Some(f) = frame {
                let lease = &f.lease;
                if kind_fits(lease.kind)
                    && lease.key == key
                    && lease.is_on(backend)
                    && lease.is_held()
                {
                    return Some(lease.clone());
                }
                frame = f.outer.as_ref();
            }
            None
        })
        .ok()
        .flatten()
}

/// Runs `work` inside the critical section of `lease`, nested in whatever
/// frames are in force where it is first polled.
pub(crate) async fn inside<F: Future>(lease: Arc<LeaseShared>, work: F) -> F::Output {
    let outer = INSIDE.try_with(Clone::clone).ok().flatten();
    INSIDE
        .scope(Some(Arc::new(Frame { lease, outer })), work)
        .await
}

/// Runs `work` inside the critical sections of all `leases` at once (a
/// [`MultiGuard`](crate::MultiGuard)'s), nested in whatever frames are in
/// force where it is first polled.
pub(crate) async fn inside_all<F: Future>(leases: Vec<Arc<LeaseShared>>, work: F) -> F::Output {
    let mut top = INSIDE.try_with(Clone::clone).ok().flatten();
    for lease in leases {
        top = Some(Arc::new(Frame { lease, outer: top }));
    }
    INSIDE.scope(top, work).await
}
