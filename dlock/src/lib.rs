//! Distributed locks for async Rust.
//!
//! One attribute turns an `async fn` into a critical section that holds a
//! lease on a coordination service. The lease lives in a [`LockGuard`]: a
//! background watchdog renews it while the guard lives, and the guard gives
//! it back by compare-and-delete when it is dropped. Only the guard can
//! release, and only its own token.
//!
//! ```
//! use dlock::{distributed_lock, LockError, LockGuard};
//!
//! #[derive(Debug)]
//! enum AppError { Lock(LockError) }
//! impl From<LockError> for AppError {
//!     fn from(e: LockError) -> Self { AppError::Lock(e) }
//! }
//!
//! #[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s")]
//! async fn pay(id: u64, guard: &LockGuard) -> Result<u64, AppError> {
//!     // Only one caller in the whole fleet runs this for a given `id` at a time.
//!     Ok(guard.fencing_token().unwrap_or(0))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), AppError> {
//! dlock::registry().set_default(dlock::connect("memory://").await?);
//! let fence = pay(42).await?;     // callers do not pass the guard
//! assert!(fence > 0);
//! # Ok(()) }
//! ```
//!
//! The same without the macro: [`Lock`]. Several keys held at once, in an
//! order that cannot deadlock: [`MultiLock`]. Shared readers and one writer:
//! [`RwLock`]. One leader at a time, with a term that fences:
//! [`Election`]. Backends: [`backends`]; the
//! contract a backend implements: [`LockBackend`].
//!
//! The manual, page by page (attribute, backends, guarantees, operations): [`guide`].
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

#[cfg(feature = "axum")]
mod axum;
pub mod backend;
pub mod backends;
mod blocking;
mod connect;
pub mod fence;
pub mod guide;
pub mod inspect;
mod lease;
mod locks;
#[cfg(test)]
mod locks_only;
mod registry;
mod shutdown;
pub mod url;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use axum::HttpError;
pub use backend::error::LockError;
pub use backend::holder::{default_client_name, LockInfo};
pub use backend::key::MAX_KEY_BYTES;
pub use backend::{Leader, LockBackend};
pub use blocking::connect_blocking;
pub use connect::connect;
/// ```
/// use dlock::{distributed_lock, LockError, LockGuard};
///
/// #[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s")]
/// async fn pay(id: u64, guard: &LockGuard) -> Result<u64, LockError> {
///     // Only one caller in the whole fleet runs this for a given `id` at a time.
///     Ok(guard.fencing_token().unwrap_or(0))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let fence = pay(42).await?; // callers do not pass the guard
/// assert!(fence > 0);
/// # Ok(()) }
/// ```
#[doc(inline)]
pub use dlock_macros::distributed_lock;
pub use inspect::{list_locks, list_semaphores};
pub use lease::ttl::{DEFAULT_TTL, MAX_TTL, MIN_TTL};
pub use locks::barrier::{Barrier, BarrierMember};
pub use locks::count_down_latch::CountDownLatch;
pub use locks::election::{Election, Leadership};
pub use locks::guard::LockGuard;
pub use locks::lock::Lock;
pub use locks::multi::MultiLock;
pub use locks::multi_guard::MultiGuard;
pub use locks::rwlock::RwLock;
pub use locks::segmented::SegmentedLock;
pub use locks::semaphore::{Permit, Semaphore};
pub use registry::{registry, Registry};
pub use shutdown::shutdown;
