//! `Barrier`: a distributed double barrier (Curator's
//! `DistributedDoubleBarrier`, the ZooKeeper recipe), and `BarrierMember`,
//! a member between `enter` and `leave`.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use crate::backend::{deadline, no_barriers};
use crate::lease::acquire::{self, take, Observed, Target};
use crate::lease::observe::Kind;
use crate::lease::options::{lease_option_setters, LeaseOptions};
use crate::{LockError, LockGuard};

/// A double barrier: [`enter`](Self::enter) returns once `parties` members
/// have entered, and [`BarrierMember::leave`] returns once every member has
/// left, across every process that uses the same name on the same service.
///
/// "No worker begins batch 7 until all 3 have joined, and none moves on
/// until all have finished."
///
/// - Each member is a lease of its own: the watchdog renews it while its
///   [`BarrierMember`] lives, and a member whose process dies is counted
///   out when its lease ends (its ttl; on ZooKeeper its session), so
///   the others are not held forever: a member counted out before the
///   barrier opened no longer counts towards `parties`; one counted out
///   after it no longer holds `leave` up.
/// - `parties` is a threshold, as in Curator: once the barrier is open, a
///   member that enters before every member has left passes at once (on
///   ZooKeeper, the `ready` node is there). The barrier closes when its
///   last member leaves, so the name can be used for the next round; a
///   member of the next round that enters before the last member of this
///   one has left joins this round.
/// - `enter` that times out or is cancelled removes its member: a later
///   full group still opens the barrier with its own members.
/// - Inside one process at most `parties` members of one barrier live at
///   once; more wait locally until one leaves.
/// - Backends: memory, Redis (one server, Cluster, Sentinel), etcd (keys
///   on the session lease, as etcd's
///   `recipes` double barrier), ZooKeeper (Curator's layout at
///   `/<prefix>/<name>`, shared with Curator's own class), PostgreSQL
///   (rows with an expiry, `LISTEN`/`NOTIFY`) and files (a locked, leased
///   file per member and a `ready` file). Others fail
///   with [`LockError::InvalidOption`] ("… has no barriers").
///
/// Options: [`ttl`](Self::ttl) (of each member), [`wait`](Self::wait) (of
/// `enter`, and of `leave`), [`renew`](Self::renew),
/// [`backend`](Self::backend), [`with_backend`](Self::with_backend), with
/// the defaults of [`Lock`](crate::Lock).
///
/// ```
/// use dlock::Barrier;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let batch = Barrier::new("batch-7", 2);
/// let (a, b) = tokio::join!(batch.enter(), batch.enter()); // both have joined
/// let (a, b) = (a?, b?);
/// // ... each does its share of the batch ...
/// let (left_a, left_b) = tokio::join!(a.leave(), b.leave()); // both have finished
/// left_a?;
/// left_b?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Barrier {
    /// The name (as a key) and the lease options of each member.
    options: LeaseOptions,
    parties: usize,
}

impl Barrier {
    /// The most parties a barrier may have: ten thousand. More (or zero)
    /// is [`LockError::InvalidOption`] at `enter`.
    pub const MAX_PARTIES: usize = 10_000;

    /// A barrier named `name` that opens once `parties` members are in, with
    /// the default options. Nothing is checked until `enter`: zero or more
    /// than [`MAX_PARTIES`](Self::MAX_PARTIES) parties is
    /// [`LockError::InvalidOption`] then, a bad name
    /// [`LockError::InvalidKey`] (names follow the rules of lock keys).
    pub fn new(name: impl Into<String>, parties: usize) -> Self {
        Barrier {
            options: LeaseOptions::new(name.into()),
            parties,
        }
    }

    lease_option_setters! {
        ttl: "The lease length of each member (see [`Lock::ttl`](crate::Lock::ttl)): a member whose process dies is counted out after it (on ZooKeeper, after the session timeout).",
        wait: "How long [`enter`](Self::enter) waits for the other parties, and
    [`BarrierMember::leave`] for the other members to leave: [`LockError::Timeout`] after it.
    No limit by default.",
        renew: "Renewal of each member by the watchdog (on by default; see [`Lock::renew`](crate::Lock::renew)).",
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        &self.options.key
    }

    /// How many members open the barrier.
    pub fn parties(&self) -> usize {
        self.parties
    }

    /// Enters the barrier and waits, up to the configured `wait`, until
    /// `parties` members are in (or the barrier is open already).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for zero or too many parties, a bad ttl
    /// or a backend without barriers; [`LockError::Timeout`] when the other
    /// parties did not come within the wait (the member is removed);
    /// [`LockError::InvalidKey`], [`LockError::NoBackend`],
    /// [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// Dropping the future removes the member (in the background, if it was
    /// on the server already): it does not count towards `parties`.
    pub async fn enter(&self) -> Result<BarrierMember, LockError> {
        let wait = self.options.wait;
        let entered = acquire::watched(
            &self.options,
            Kind::Barrier,
            wait,
            false,
            self.enter_within(wait),
        )
        .await?;
        let waited = wait.unwrap_or_default();
        entered.ok_or_else(|| LockError::Timeout {
            key: self.options.key.to_string(),
            waited,
        })
    }

    async fn enter_within(
        &self,
        wait: Option<Duration>,
    ) -> Result<Option<BarrierMember>, LockError> {
        if self.parties == 0 || self.parties > Self::MAX_PARTIES {
            return Err(LockError::invalid_option(format!(
                "barrier `{}` has {} parties; give it 1..={} (dlock::Barrier::MAX_PARTIES)",
                self.name(),
                self.parties,
                Self::MAX_PARTIES
            )));
        }
        let backend = self.options.check()?;
        if backend.barrier().is_none() {
            return Err(no_barriers(&backend.describe()));
        }
        // A zero wait is one look (`take` asks with a deadline of now), never
        // a `Busy`: the others may simply not be there yet.
        let wait = wait.map(|w| w.max(Duration::from_millis(1)));
        let target = Target::Member {
            parties: self.parties,
        };
        let taken = take(&self.options, backend, target, wait, Kind::Barrier).await?;
        Ok(taken.map(|taken| BarrierMember {
            guard: LockGuard::from(taken),
            wait: self.options.wait,
        }))
    }
}

/// A member of a [`Barrier`] between `enter` and `leave`: the member's lease
/// lives while it lives.
///
/// The watchdog renews it every ttl/3 (unless renewal is off);
/// [`lost`](Self::lost) resolves if the member was counted out (its lease
/// lost); [`leave`](Self::leave) leaves and waits for the others; dropping
/// it without `leave` removes the member in the background (the others'
/// `leave` then does not wait for it).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://").await?;
/// let member = dlock::Barrier::new("solo", 1).with_backend(backend).enter().await?;
/// assert_eq!(member.name(), "solo");
/// assert!(member.is_held());
/// member.leave().await?;
/// # Ok(()) }
/// ```
#[must_use = "the member leaves the barrier as soon as it is dropped"]
#[clippy::has_significant_drop]
pub struct BarrierMember {
    /// The lease machinery of locks, on a member lease.
    guard: LockGuard,
    /// The barrier's `wait`, for `leave`.
    wait: Option<Duration>,
}

impl fmt::Debug for BarrierMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BarrierMember")
            .field("name", &self.name())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl Observed for BarrierMember {
    fn observed(&self) -> (bool, Option<u64>) {
        (false, None)
    }
}

impl BarrierMember {
    /// The barrier's name.
    pub fn name(&self) -> &str {
        self.guard.key()
    }

    /// The member's owner token: at least 128 random bits, hex encoded.
    pub fn token(&self) -> &str {
        self.guard.token()
    }

    /// True while the member is in: not left, not counted out, and its
    /// lease's local deadline not passed.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when the member is counted out (its lease lost); never if
    /// it leaves first. The future is `'static`, as [`LockGuard::lost`].
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        self.guard.lost()
    }

    /// Leaves the barrier and waits, up to the barrier's `wait`, until every
    /// member has left (or was counted out). The last member to go closes
    /// the barrier, so its name can be entered again for the next round.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when others were still in at the end of the
    /// wait (this member has left all the same); [`LockError::Backend`].
    /// A member counted out before it leaves still waits for the others.
    ///
    /// # Cancel safety
    /// If this future is dropped, the member still leaves (in the
    /// background); only the wait for the others ends.
    pub async fn leave(self) -> Result<(), LockError> {
        let shared = self.guard.lease().clone();
        let key = shared.key.clone();
        let label = shared.label().clone();
        let backend = shared.backend.clone();
        let lease = shared.lock_state().lease.clone();
        let started = Instant::now();
        let wait = self.wait;
        let left = crate::lease::observe::operation::operation(
            "leave",
            &key,
            &label,
            async move {
                match self.guard.release().await {
                    // Counted out already: the others still go by.
                    Ok(()) | Err(LockError::NotHeld { .. }) => {}
                    Err(e) => return Err(e),
                }
                let Some(barriers) = backend.barrier() else {
                    return Err(no_barriers(&backend.describe()));
                };
                let until = wait.and_then(deadline::after);
                barriers.wait_all_left(&lease, until).await
            },
            |&all| if all { "left" } else { "timeout" },
        )
        .await?;
        if left {
            Ok(())
        } else {
            Err(LockError::Timeout {
                key: shared.key.clone(),
                waited: started.elapsed(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::memory::MemoryBackend;
    use std::sync::Arc;

    fn barrier(name: &str, parties: usize) -> Barrier {
        Barrier::new(name, parties).with_backend(Arc::new(MemoryBackend::new()))
    }

    #[test]
    fn member_is_send_sync() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<BarrierMember>();
    }

    #[tokio::test]
    async fn zero_or_too_many_parties_is_an_invalid_option() {
        for parties in [0, Barrier::MAX_PARTIES + 1, usize::MAX] {
            let err = barrier("bad", parties).enter().await.unwrap_err();
            assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
            assert!(err.to_string().contains("parties"), "{err}");
        }
    }

    #[tokio::test]
    async fn a_backend_without_barriers_says_so() {
        let backend = Arc::new(crate::locks_only::LocksOnly::default());
        let err = Barrier::new("b", 2)
            .with_backend(backend)
            .enter()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(err.to_string().contains("has no barriers"), "{err}");
    }
}
