//! The leader election capability: what the core asks of a backend that can
//! publish who leads an election ([`ElectionBackend`], offered through
//! [`LockBackend::election`](super::LockBackend::election)), and the error
//! of one that cannot.
//!
//! An election is the lock of its name: the core takes that lock through
//! its ordinary path (local queue, server-woken waiting, watchdog), and the
//! lease's fencing token is the leader's term. What a backend adds is the
//! leader's record beside the lock (its value and term, written only while
//! the lease holds the key) and an announcement of every change of it.

use std::fmt;

use async_trait::async_trait;

use super::Lease;
use crate::LockError;

/// Who leads an election: the value its leader published and its term.
///
/// The term is the leader's fencing token: strictly greater than the term
/// of every earlier leader of the same election.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leader {
    /// What the leader published ([`Election::campaign`](crate::Election::campaign),
    /// [`Leadership::proclaim`](crate::Leadership::proclaim)): an address, a
    /// node name.
    pub value: String,
    /// The leader's term: its fencing token.
    pub term: u64,
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (term {})", self.value, self.term)
    }
}

/// The longest value a backend of this crate stores for a leader, in bytes
/// (64 KiB): far more than an address or a node name, and far below what
/// every service accepts in one request.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// What an election's watch learned ([`LeaderChanges::changed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderChange {
    /// The leader may have changed, and the watch does not know to what:
    /// read [`ElectionBackend::leader`] (a reconnection after which news
    /// may have been missed, or a backend whose announcements carry no
    /// record).
    Unknown,
    /// This leader published this value: it was elected, or proclaimed a
    /// new value in its term.
    Elected(Leader),
    /// The leader of this term stepped down; nobody leads until the next
    /// `Elected`.
    Ended {
        /// The term that ended.
        term: u64,
    },
    /// The watch has ended (its session did): the caller watches anew,
    /// then reads.
    Closed,
}

/// Announcements of changes of one election's leader, from
/// [`ElectionBackend::watch`]. Subscribed on the server when it is made, so
/// a change after that is not missed.
#[async_trait]
pub trait LeaderChanges: Send + Sync {
    /// The next change since the last call (or since the watch was made),
    /// in the order the server made them. A backend that announces each
    /// record as it is written ([`LeaderChange::Elected`],
    /// [`LeaderChange::Ended`]) lets an observer see every term however
    /// short, as far as [`ElectionBackend::confirm`] vouches for each
    /// announcement; one that only knows that something changed answers
    /// [`LeaderChange::Unknown`] and the observer reads.
    async fn changed(&mut self) -> LeaderChange;
}

/// The elections of a backend that has them: the capability a
/// [`LockBackend`](super::LockBackend) offers through
/// [`election`](super::LockBackend::election).
///
/// The lease of an election is an ordinary lock lease on the election's
/// name, taken by [`LockBackend::acquire`](super::LockBackend::acquire); its
/// fencing token is the term. A backend stores the leader's record (the
/// lease's token, the value, the term) so that [`leader`](Self::leader)
/// answers from any process, and announces each change of it so that
/// [`watch`](Self::watch) needs no polling.
#[async_trait]
pub trait ElectionBackend: Send + Sync {
    /// The longest value, in bytes, this backend stores for a leader.
    fn max_value_bytes(&self) -> usize {
        MAX_VALUE_BYTES
    }

    /// Whether the backend keeps elections in a layout of its own (etcd's
    /// `concurrency.Election`) rather than as the lock of the election's
    /// name. Then the core takes the leader's lease by
    /// [`campaign`](Self::campaign), not by
    /// [`LockBackend::acquire`](super::LockBackend::acquire); it is renewed
    /// and released as a lock lease on the entry named in its `resource`,
    /// and its fencing token is the term. The default is `false`.
    fn own_layout(&self) -> bool {
        false
    }

    /// Campaigns for the election `req.key` with `value` in the backend's
    /// own layout (only called when [`own_layout`](Self::own_layout)):
    /// the leader's lease once elected, `Ok(None)` when `deadline` passed
    /// first (`once`: a single attempt, never waiting). Cancel safe, as
    /// [`LockBackend::acquire`](super::LockBackend::acquire). The default
    /// refuses: the backend's elections are the lock of the name.
    async fn campaign(
        &self,
        req: &super::AcquireRequest,
        value: &str,
        deadline: Option<std::time::Instant>,
        once: bool,
    ) -> Result<Option<Lease>, LockError> {
        let _ = (req, value, deadline, once);
        Err(LockError::invalid_option(
            "this backend's elections are the lock of their name; it has no campaign of its own",
        ))
    }

    /// Publishes `value` as the leader of the election `lease.key`, with
    /// the lease's fencing token as its term, if the lease still holds the
    /// key (checked in the same atomic step as the write), and announces it.
    /// `Ok(false)`: the lease no longer holds the key; nothing was written.
    /// With [`own_layout`](Self::own_layout), the campaign wrote the first
    /// value; this changes it.
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool, LockError>;

    /// Removes the leader's record published under `lease`, if it is still
    /// that one, and announces that nobody leads: a resignation, before the
    /// lease itself is released.
    async fn withdraw(&self, lease: &Lease) -> Result<(), LockError>;

    /// Who leads the election `name` now: its record, if the lease it was
    /// published under still holds the lock of `name`. `None` otherwise
    /// (nobody leads, or the leader's lease expired or is being handed over).
    async fn leader(&self, name: &str) -> Result<Option<Leader>, LockError>;

    /// Announcements of changes of the leader of `name`, subscribed before
    /// this returns.
    async fn watch(&self, name: &str) -> Result<Box<dyn LeaderChanges>, LockError>;

    /// Whether `change` ([`LeaderChange::Elected`] or
    /// [`LeaderChange::Ended`]), heard on a [`watch`](Self::watch) of
    /// `name`, is a change this backend's own operations made. An observer
    /// reports a confirmed change as it is; for one not confirmed (or an
    /// error) it reads [`leader`](Self::leader) instead and reports what
    /// the read shows, so a forged or replayed announcement costs a read
    /// and never shows a leader nobody elected, pins a term, or hides the
    /// real leader.
    ///
    /// The default, `true`, suits announcements that only the backend's
    /// own store can make (memory's, in-process; etcd's, events of its own
    /// keys). A backend whose announcements travel where any client may
    /// speak (Redis `PUBLISH`, PostgreSQL `NOTIFY`) checks them against
    /// what it wrote, or answers `false` to have them read.
    async fn confirm(&self, name: &str, change: &LeaderChange) -> Result<bool, LockError> {
        let _ = (name, change);
        Ok(true)
    }
}

/// The error of a backend that has no leader election: what
/// [`Election`](crate::Election) answers when
/// [`LockBackend::election`](super::LockBackend::election) is `None`. It
/// names the backend (`backend` is its
/// [`describe`](super::LockBackend::describe) text) and the backends that
/// have elections.
///
/// ```
/// let e = dlock::backend::no_elections("redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003");
/// assert!(matches!(e, dlock::LockError::InvalidOption { .. }));
/// assert!(e.to_string().contains("no leader election"));
/// // A backend that has elections but was told not to fence:
/// let e = dlock::backend::no_elections("redis://127.0.0.1:6379/?fence=off");
/// assert!(e.to_string().contains("drop `?fence=off`"));
/// ```
pub fn no_elections(backend: &str) -> LockError {
    if crate::url::has_query_value(backend, "fence", "off") {
        return LockError::invalid_option(format!(
            "{backend} runs without fencing tokens (`?fence=off`), and an election's term is its leader's fencing token: drop `?fence=off` from the URL of the backend that runs `Election` (another backend of the same server may keep it)"
        ));
    }
    LockError::invalid_option(format!(
        "the {backend} backend has no leader election yet; use a {} backend for `Election`",
        crate::backend::schemes::with_elections_listed()
    ))
}
