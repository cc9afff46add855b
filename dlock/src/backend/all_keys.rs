//! The multi-key capability: several lock keys taken all or none in one
//! call to the service, for [`MultiLock`](crate::MultiLock).

use std::time::Instant;

use async_trait::async_trait;

use super::{AcquireRequest, Lease};
use crate::LockError;

/// What [`AllKeysBackend`] answers.
#[derive(Debug)]
pub enum AllOrNone {
    /// Every key was taken: one lease per request, in the order asked.
    Taken(Vec<Lease>),
    /// No key was taken: the request at `index` names a key held by someone
    /// else (for [`AllKeysBackend::acquire_all`]: still held when the
    /// deadline passed).
    Held {
        /// The position of that key's request in the slice asked for.
        index: usize,
    },
}

/// Lock keys taken all or none in one call: the capability a
/// [`LockBackend`](super::LockBackend) offers through
/// [`all_keys`](super::LockBackend::all_keys) when it can take several keys
/// atomically (a single Redis server, in one script).
///
/// Without it a [`MultiLock`](crate::MultiLock) takes its keys one by one
/// in canonical order. With it, the core still takes this process's local
/// turns key by key in that order, then asks for every key not already
/// held in one call: no key is ever held while another is waited for on
/// the service, so there is nothing to give back on a busy key.
///
/// Each lease is an ordinary lock lease (renewed by
/// [`LockBackend::renew`](super::LockBackend::renew), released by
/// [`LockBackend::release`](super::LockBackend::release)), with its own
/// token and fencing token, exactly as if its key had been taken alone.
/// The contract of [`LockBackend::acquire`](super::LockBackend::acquire)
/// (cancel safety, transport failures, local deadlines) holds for the
/// whole call: a dropped call leaves no key held.
///
/// ```
/// use dlock::backend::{AllKeysBackend, LockBackend};
///
/// fn atomic(backend: &dyn LockBackend) -> bool {
///     backend.all_keys().is_some()
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// // The memory backend takes a MultiLock's keys one by one.
/// assert!(!atomic(dlock::connect("memory://").await?.as_ref()));
/// # Ok(()) }
/// ```
#[async_trait]
pub trait AllKeysBackend: Send + Sync {
    /// One attempt at every key of `reqs` at once; never waits.
    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<AllOrNone, LockError>;

    /// Takes every key of `reqs` at once, waiting (woken by the service)
    /// until all are free or until `deadline` (`None`: no limit).
    async fn acquire_all(
        &self,
        reqs: &[AcquireRequest],
        deadline: Option<Instant>,
    ) -> Result<AllOrNone, LockError>;
}
