//! The lease machinery every kind of lock shares: how a lease is taken,
//! held, renewed, lost and given back.
//!
//! - `acquire.rs`: the one acquire path (local queue, then the backend, then
//!   the watchdog), cancellation-safe at every await.
//! - `queue.rs`: per-key local queue, so one process sends one waiter to the server.
//! - `local.rs`: per backend, its queue and its watchdog.
//! - `held.rs`: the held lease (record, status, loss, release path).
//! - `watchdog.rs`: renewal and the lease's deadlines.
//! - `background.rs`: dlock's own runtime (watchdog, background releases,
//!   every backend's connections), so renewal never waits on the caller's runtime.
//! - `options.rs`: the one `LeaseOptions` every kind is configured with.
//! - `ttl.rs`: the ttl bounds.
//! - `observe.rs`: spans, events and metrics of every operation.

pub(crate) mod acquire;
pub(crate) mod background;
pub(crate) mod held;
pub(crate) mod local;
pub(crate) mod observe;
pub(crate) mod options;
pub(crate) mod queue;
pub(crate) mod ttl;
pub(crate) mod watchdog;
