//! The lock kinds' way into the acquire path: reentrancy first (inside
//! the critical section of a held lease on the same key and backend, a
//! reentrant guard and no round trip), then [`take`], whose lease becomes a
//! [`LockGuard`].

use std::time::Duration;

use crate::backend::RwMode;
use crate::lease::acquire::{take, watched, Observed, Target};
use crate::lease::held::LeaseKind;
use crate::lease::observe::Kind;
use crate::lease::options::LeaseOptions;
use crate::locks::guard::LockGuard;
use crate::{locks::scope, LockError};

impl Observed for LockGuard {
    fn observed(&self) -> (bool, Option<u64>) {
        (self.is_reentrant(), self.fencing_token())
    }
}

/// Takes the lock on the options' key as one step of a larger acquisition
/// (a [`MultiLock`](crate::MultiLock)'s key): its own `dlock.acquire` span,
/// reentrant like [`lock_within`], waiting up to `wait` (zero: one
/// attempt). `Ok(None)`: not acquired in time.
pub(crate) async fn lock_watched(
    options: &LeaseOptions,
    wait: Option<Duration>,
) -> Result<Option<LockGuard>, LockError> {
    let once = wait == Some(Duration::ZERO);
    watched(
        options,
        Kind::Lock,
        wait,
        once,
        lock_within(options, wait, Kind::Lock),
    )
    .await
}

/// The guard of a lease on the options' key whose critical section the
/// running code is inside of, if any: a reentrant guard, no round trip.
pub(crate) fn held_here(options: &LeaseOptions) -> Result<Option<LockGuard>, LockError> {
    let backend = options.check()?;
    Ok(scope::enclosing(&backend, &options.key).map(LockGuard::reentrant))
}

/// Takes the lock on the options' key, waiting up to `wait` (`None`: no
/// limit; zero: one attempt); reentrant inside the critical section of a
/// guard that holds it. `Ok(None)`: not acquired in time.
pub(crate) async fn lock_within(
    options: &LeaseOptions,
    wait: Option<Duration>,
    observed: Kind,
) -> Result<Option<LockGuard>, LockError> {
    let backend = options.check()?;
    if let Some(held) = scope::enclosing(&backend, &options.key) {
        return Ok(Some(LockGuard::reentrant(held)));
    }
    let taken = take(options, backend, Target::Lock, wait, observed).await?;
    Ok(taken.map(LockGuard::from))
}

/// Takes a `mode` lease on the read-write lock of the options' key, waiting
/// up to `wait` (as [`lock_within`]). Inside the critical section of a
/// lease on the same read-write lock and backend: a write holder's read or
/// write, and a read holder's read, re-enter; a read holder's write is
/// [`LockError::InvalidOption`] at once, as it would wait for itself.
pub(crate) async fn rw_within(
    options: &LeaseOptions,
    mode: RwMode,
    wait: Option<Duration>,
    observed: Kind,
) -> Result<Option<LockGuard>, LockError> {
    let backend = options.check()?;
    if let Some(held) = scope::enclosing_rw(&backend, &options.key) {
        return match (held.kind, mode) {
            (LeaseKind::Rw(RwMode::Read), RwMode::Write) => Err(LockError::invalid_option(format!(
                "write on read-write lock `{}` asked inside the scope of a read guard of it: the write would wait for that reader, itself, for ever; release the read guard first, or take the write lease from the start",
                options.key
            ))),
            _ => Ok(Some(LockGuard::reentrant(held))),
        };
    }
    let taken = take(options, backend, Target::Rw(mode), wait, observed).await?;
    Ok(taken.map(LockGuard::from))
}
