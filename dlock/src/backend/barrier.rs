//! The double-barrier capability: what the core asks of a backend that has
//! barriers ([`BarrierBackend`], offered through
//! [`LockBackend::barrier`](super::LockBackend::barrier)), and the error of
//! one that has none.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Lease, Renewal};
use crate::LockError;

/// The backends that have barriers, by their first URL scheme: what
/// [`no_barriers`] names. Kept here, not in the scheme table, so the table
/// keeps one column per older capability.
const WITH_BARRIERS: &str = "memory, redis, etcd, zk, postgres or file";

/// What the core asks a backend to enter: one member of a double barrier.
///
/// A member is held under its own token and leased on its own (a
/// session-bound node or key, or a key with a ttl the watchdog renews), so
/// a member whose process dies is counted out.
#[derive(Clone, PartialEq, Eq)]
pub struct BarrierRequest {
    /// The validated barrier name, before the backend maps it into its namespace.
    pub name: String,
    /// How many members open the barrier (at least 1). It is a threshold,
    /// as in Curator: more members may enter an open barrier.
    pub parties: usize,
    /// The member's owner token (≥ 128 random bits, hex).
    pub token: String,
    /// The lease length the server should enforce on the member.
    pub ttl: Duration,
}

impl fmt::Debug for BarrierRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BarrierRequest")
            .field("name", &self.name)
            .field("parties", &self.parties)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// The error of a backend that has no barriers: what
/// [`Barrier`](crate::Barrier) answers when
/// [`LockBackend::barrier`](super::LockBackend::barrier) is `None`. It names
/// the backend (`backend` is its [`describe`](super::LockBackend::describe)
/// text) and the backends that have barriers.
///
/// ```
/// let e = dlock::backend::no_barriers("mysql://db:3306");
/// assert!(matches!(e, dlock::LockError::InvalidOption { .. }));
/// assert!(e.to_string().contains("has no barriers"));
/// ```
pub fn no_barriers(backend: &str) -> LockError {
    LockError::invalid_option(format!(
        "the {backend} backend has no barriers; use a {WITH_BARRIERS} backend for `Barrier`"
    ))
}

/// The double barriers of a backend that has them: the capability a
/// [`LockBackend`](super::LockBackend) offers through
/// [`barrier`](super::LockBackend::barrier).
///
/// A member is an ordinary [`Lease`] (its `key` is the barrier name, its
/// `token` the member's owner token, `resource` the backend's name for the
/// member). The core registers it with the watchdog, which renews it
/// through [`renew_members`](Self::renew_members); a member's guard leaves
/// through [`remove_member`](Self::remove_member). The contract of
/// [`LockBackend`](super::LockBackend) (cancel safety, transport failures,
/// local deadlines) holds here too.
///
/// - **memory**: a table of members with deadlines, and a `ready` flag.
/// - **redis**: a sorted set of member tokens scored by expiry (and an
///   `open` member), changes published on a channel.
/// - **etcd**: keys on the session lease under the barrier's prefix, a
///   `ready` key, a watch on the prefix (etcd's `recipes` double barrier).
/// - **zookeeper**: Curator's `DistributedDoubleBarrier`: an ephemeral
///   node per member under `/<prefix>/<name>`, and a `ready` node.
/// - **postgres**: a row per member in `dlock_barriers` with an expiry on
///   the server's clock, and a `ready` row; changes announced with
///   `NOTIFY` on the barrier's channel.
/// - **file**: a member file per member, locked (`flock`) and leased like
///   a permit, and a `ready` file (Curator's layout), under
///   `<prefix>~barrier~<name>`; waiters woken by inotify on the directory.
#[async_trait]
pub trait BarrierBackend: Send + Sync {
    /// Adds a member to the barrier `req.name` and waits until the barrier
    /// opens: `req.parties` members are in, or it is open already (a
    /// member that arrives while the others have not all left yet passes
    /// at once). `Ok(None)` means `deadline` passed: the member is removed
    /// first. Dropping the future removes the member (in the background).
    /// Woken by the service, never by polling.
    async fn enter_barrier(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError>;

    /// Waits until no member of the barrier that `member` entered is left
    /// (the caller has removed `member` already), then closes the barrier
    /// for the next round. `Ok(false)` means `deadline` passed first.
    /// Cancel safe: it changes nothing but the closing, which is idempotent.
    async fn wait_all_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError>;

    /// Extends every member lease in `leases`, as
    /// [`LockBackend::renew`](super::LockBackend::renew) does for locks.
    async fn renew_members(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>>;

    /// Removes the member `lease` if it is still there. `Ok(false)` means it
    /// was gone already (counted out).
    async fn remove_member(&self, lease: &Lease) -> Result<bool, LockError>;
}
