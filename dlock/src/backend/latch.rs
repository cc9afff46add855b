//! The count-down latch capability: what the core asks of a backend that has
//! latches ([`LatchBackend`], offered through
//! [`LockBackend::latch`](super::LockBackend::latch)), and the error of one
//! that has none.

use std::time::Instant;

use async_trait::async_trait;

use crate::LockError;

/// The backends with count-down latches, by their first scheme. Kept here
/// (not in the scheme table) so each capability's list lives in its own file.
const WITH_LATCHES: &[&str] = &["memory", "redis", "etcd", "zk", "postgres", "file"];

/// The error of a backend that has no count-down latches: what
/// [`CountDownLatch`](crate::CountDownLatch) answers when
/// [`LockBackend::latch`](super::LockBackend::latch) is `None`. It names the
/// backend (`backend` is its [`describe`](super::LockBackend::describe) text)
/// and the backends that have latches.
///
/// ```
/// let e = dlock::backend::no_latches("redlock://127.0.0.1:6379,127.0.0.1:6380");
/// assert!(matches!(e, dlock::LockError::InvalidOption { .. }));
/// assert!(e.to_string().contains("memory://"));
/// ```
pub fn no_latches(backend: &str) -> LockError {
    let listed: Vec<String> = WITH_LATCHES.iter().map(|s| format!("{s}://")).collect();
    let listed = match listed.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    LockError::invalid_option(format!(
        "the {backend} backend has no count-down latches; use a {listed} backend for `CountDownLatch`"
    ))
}

/// The count-down latches of a backend that has them: the capability a
/// [`LockBackend`](super::LockBackend) offers through
/// [`latch`](super::LockBackend::latch).
///
/// A latch is a count stored on the service under a validated name (the
/// backend maps it into its namespace). The core checks the name and the
/// count's range before it calls; a backend keeps these rules:
/// - [`try_set_count`](Self::try_set_count) sets the count only while it is
///   zero or unset, in one atomic step on the server;
/// - [`count_down`](Self::count_down) never takes the count below zero, and
///   the step that reaches zero wakes every waiter (publish, watch, notify);
/// - [`wait_zero`](Self::wait_zero) is woken by the service, never by
///   polling; it subscribes (or watches) before it reads the count, so a
///   count-down between the read and the wait is not missed; the waiters of
///   one name in one process share one subscription or watch; dropping its
///   future leaves nothing behind.
///
/// - **memory**: a count per name and a `watch` channel its waiters share.
/// - **redis**: a string key, counted down by a script that publishes `0`
///   on the latch's channel when it reaches zero (and `1` when a count is
///   set), the layout of Redisson's `RCountDownLatch`.
/// - **etcd**: a key without a lease, set in a transaction, counted down by
///   compare-and-swap; waiters share one watch of the key.
/// - **zookeeper**: a persistent node whose data is the count, created where
///   none is, counted down by versioned `setData` (deleted at zero); waiters
///   share one exists/data watch of the node.
/// - **postgres**: a row of `dlock_latches`, deleted at zero by the
///   count-down that announces it with `NOTIFY` on the latch's channel;
///   waiters share one `LISTEN` on the backend's listening connection.
/// - **file**: the count file `<prefix>~latch~<name>.count`, renamed into
///   place (`RENAME_NOREPLACE`), counted down in place under `flock` and
///   removed at zero; waiters share the process's inotify watch of the
///   directory.
#[async_trait]
pub trait LatchBackend: Send + Sync {
    /// Sets the count of the latch `name` to `count` (at least 1) if it is
    /// zero or unset: `Ok(true)`; `Ok(false)` while a count is live.
    async fn try_set_count(&self, name: &str, count: u64) -> Result<bool, LockError>;

    /// Takes one from the count of `name`; nothing at zero or unset. The
    /// step that reaches zero wakes the waiters.
    async fn count_down(&self, name: &str) -> Result<(), LockError>;

    /// The count of `name`: 0 when unset.
    async fn count(&self, name: &str) -> Result<u64, LockError>;

    /// Waits until the count of `name` is zero (at once if it is zero or
    /// unset): `Ok(true)`; `Ok(false)` when `deadline` passed first (`None`:
    /// no limit). Cancel safe: dropping the future leaves no server state
    /// and no subscription of its own.
    async fn wait_zero(&self, name: &str, deadline: Option<Instant>) -> Result<bool, LockError>;
}
