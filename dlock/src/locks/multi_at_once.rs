//! A [`MultiLock`](crate::MultiLock)'s keys taken in one call, on a backend
//! that can take several keys all or none ([`AllKeysBackend`]): the local
//! turns key by key in canonical order, then one request for every key not
//! already held here.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{AcquireRequest, AllKeysBackend, AllOrNone, LockBackend};
use crate::lease::held::{LeaseKind, LeaseShared, NewLease};
use crate::lease::observe::{Acquisition, Kind, Outcome};
use crate::lease::options::LeaseOptions;
use crate::lease::queue::Turn;
use crate::lease::ride_through::RideThrough;
use crate::locks::guard::LockGuard;
use crate::{backend::deadline, lease::local, locks::scope, LockError};

/// Why not every key was taken: the position of the key (in `keys`) that
/// stayed held by someone else, or that failed with the error.
pub(crate) enum NotTaken {
    Held(usize),
    Failed(usize, LockError),
}

/// One key on its way: its `dlock.acquire` span, and either the guard that
/// re-entered it or this process's turn on it.
struct Pending {
    watch: Acquisition,
    step: Step,
}

enum Step {
    Reentered(LockGuard),
    Turn(Turn),
}

/// Takes every key of `keys` (canonical order) on `backend`, which has
/// `all`: inside a guard's scope a key re-enters; the others are asked for
/// together, waiting up to `wait` (zero: one attempt). Each key keeps its
/// own `dlock.acquire` span and metrics, as when keys are taken one by one.
/// Dropped, the local turns are given back and the backend's call cancels
/// its own (its contract: a dropped call leaves no key held).
pub(crate) async fn take_all(
    options: &LeaseOptions,
    keys: &[String],
    backend: &Arc<dyn LockBackend>,
    all: &dyn AllKeysBackend,
    wait: Option<Duration>,
) -> Result<Vec<LockGuard>, NotTaken> {
    let local = local::for_backend(backend);
    let once = wait == Some(Duration::ZERO);
    let deadline = wait.and_then(deadline::after);
    let label = options.label();
    let mut pending = Vec::with_capacity(keys.len());
    for (at, key) in keys.iter().enumerate() {
        let watch = Acquisition::start(Kind::Lock, key, label.clone(), options.ttl, wait);
        if let Some(held) = scope::enclosing(backend, key) {
            let guard = LockGuard::reentrant(held);
            pending.push(Pending {
                watch,
                step: Step::Reentered(guard),
            });
            continue;
        }
        let slot = local.queue.slot(key);
        let Some(turn) = local.queue.turn_of(slot, 1, once, deadline).await else {
            gave_up(pending, watch, once);
            return Err(NotTaken::Held(at));
        };
        pending.push(Pending {
            watch,
            step: Step::Turn(turn),
        });
    }

    // A transient failure with time left in the wait is asked again, with
    // new owner tokens (`lease/ride_through.rs`).
    let mut ride = RideThrough::new(once, deadline);
    let (asked, requests, answer) = loop {
        let mut asked = Vec::new();
        let mut requests = Vec::new();
        for (at, (key, one)) in keys.iter().zip(&pending).enumerate() {
            if matches!(one.step, Step::Turn(_)) {
                let token = crate::backend::holder::owner_token(&**backend)
                    .map_err(|e| NotTaken::Failed(at, e))?;
                requests.push(AcquireRequest {
                    key: key.clone(),
                    token,
                    ttl: options.ttl,
                });
                asked.push(at);
            }
        }
        let answer = if requests.is_empty() {
            Ok(AllOrNone::Taken(Vec::new()))
        } else if once {
            all.try_acquire_all(&requests).await
        } else {
            all.acquire_all(&requests, deadline).await
        };
        match answer {
            Err(e) => {
                let first = asked.first().map_or("", |&at| keys[at].as_str());
                if let Err(e) = ride.after(first, e).await {
                    break (asked, requests, Err(e));
                }
            }
            answer => {
                let first = asked.first().map_or("", |&at| keys[at].as_str());
                let granted = matches!(answer, Ok(AllOrNone::Taken(_)));
                if let Err(e) = ride.answered(first, granted) {
                    break (asked, requests, Err(e));
                }
                break (asked, requests, answer);
            }
        }
    };
    let leases = match answer {
        Ok(AllOrNone::Taken(leases)) if leases.len() == requests.len() => leases,
        Ok(AllOrNone::Taken(leases)) => {
            let error = LockError::backend(
                backend.describe(),
                format!(
                    "asked for {} keys at once, got {} leases",
                    requests.len(),
                    leases.len()
                ),
            );
            return Err(fail_all(pending, asked[0], error));
        }
        Ok(AllOrNone::Held { index }) => {
            let at = asked.get(index).copied().unwrap_or(asked[0]);
            let outcome = if once {
                Outcome::Busy
            } else {
                Outcome::Timeout
            };
            for one in pending {
                one.watch.finish(outcome, None);
            }
            return Err(NotTaken::Held(at));
        }
        Err(error) => return Err(fail_all(pending, asked[0], error)),
    };

    // Registered before `dlock::shutdown` collects leases, or given back.
    let settling = crate::lease::background::Settling::enter();
    if settling.closed() {
        for lease in &leases {
            let _ = crate::lease::held::release_on(&**backend, LeaseKind::Lock, lease).await;
        }
        return Err(fail_all(pending, asked[0], LockError::ShutDown));
    }
    let mut leases = leases.into_iter();
    let mut guards = Vec::with_capacity(keys.len());
    for one in pending {
        let guard = match one.step {
            Step::Reentered(guard) => {
                one.watch.finish(Outcome::Reentered, guard.fencing_token());
                guard
            }
            Step::Turn(turn) => {
                let lease = leases.next().expect("one lease per request, checked above");
                let shared = LeaseShared::new(NewLease {
                    backend: backend.clone(),
                    lease,
                    renew: options.renew,
                    kind: LeaseKind::Lock,
                    turn,
                    label: label.clone(),
                    observed: Kind::Lock,
                    hold_at_least: options.hold_at_least,
                });
                local.watchdog.register(&shared);
                let guard = LockGuard::outer(shared, local.watchdog.clone());
                one.watch.finish(Outcome::Acquired, guard.fencing_token());
                guard
            }
        };
        guards.push(guard);
    }
    Ok(guards)
}

/// The local turn of the key at `at` did not come: that key is busy or
/// timed out; the keys before it were never asked of the service.
fn gave_up(pending: Vec<Pending>, watch: Acquisition, once: bool) {
    let outcome = if once {
        Outcome::Busy
    } else {
        Outcome::Timeout
    };
    watch.finish(outcome, None);
    for one in pending {
        // Re-entered keys are not given back (their outer guard holds them);
        // turns are dropped here, which hands them to the next local waiter.
        one.watch.finish(Outcome::Cancelled, None);
    }
}

fn fail_all(pending: Vec<Pending>, at: usize, error: LockError) -> NotTaken {
    for one in pending {
        one.watch.finish(Outcome::Error, None);
    }
    NotTaken::Failed(at, error)
}
