//! The manual: how dlock behaves, page by page. Nothing here is code; each
//! page is a module whose documentation is one chapter, versioned with the
//! code it describes.
//!
//! In reading order:
//!
//! 1. [`macro_reference`]: `#[distributed_lock(...)]`, every argument and
//!    the error a wrong value gives; then [`Lock`](crate::Lock) and
//!    [`LockGuard`](crate::LockGuard).
//! 2. [`locks`]: the other kinds of lock: segmented locks and semaphores
//!    for hot keys, several keys at once, read-write locks, leader
//!    election.
//! 3. [`backends`]: each backend's URL and options, its layout on the
//!    server, how waiters are woken, its limits; what stays on the server;
//!    least-privilege grants.
//! 4. [`guarantees`]: what a lock promises and what it does not: leases and
//!    loss (`ensure()` before each side effect), fencing, the GETSET race
//!    as a lesson, failover windows, Redlock's limits, reentrancy,
//!    security, errors.
//! 5. [`interop`]: sharing locks with services that are not dlock (Java's
//!    Curator, Go and `etcdctl`, SQL, redis-py).
//! 6. [`observability`]: spans, events, metrics, and an example to run.
//! 7. [`operations`]: running a job once per tick, who holds a lock and
//!    freeing it, listing, shutting down, code without an async runtime,
//!    the `dlock` command.
//! 8. [`performance`]: measured costs against hand-written loops and peer
//!    crates, and how each backend scales.
//! 9. [`reliability`]: the torture run (faults injected for minutes), the
//!    soak (hours of traffic judged on leak slopes) and how to run the test
//!    suite.

#[doc = include_str!("guide/macro_reference.md")]
pub mod macro_reference {}

#[doc = include_str!("guide/locks.md")]
pub mod locks {}

#[doc = include_str!("guide/backends.md")]
pub mod backends {}

#[doc = include_str!("guide/guarantees.md")]
pub mod guarantees {}

#[doc = include_str!("guide/interop.md")]
pub mod interop {}

#[doc = include_str!("guide/observability.md")]
pub mod observability {}

#[doc = include_str!("guide/operations.md")]
pub mod operations {}

#[doc = include_str!("guide/performance.md")]
pub mod performance {}

#[doc = include_str!("guide/reliability.md")]
pub mod reliability {}
