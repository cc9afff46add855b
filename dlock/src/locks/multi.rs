//! `MultiLock`: several keys taken all or none, in one canonical order, so
//! callers that name the same keys in any order never deadlock.
//!
//! `MultiLock::new(keys)` sorts and dedups its keys once (the canonical order). `acquire` /
//! `try_acquire` check every key first (`LeaseOptions::check` per key, `MAX_KEYS`), open the
//! `dlock.acquire_all` span (lease/observe.rs), and `take_in_order` takes the keys one by one through
//! `within::lock_watched`: the ordinary lock path (`lock_within` → reentrancy or `take`) with
//! what is left of the one deadline, each in its own `dlock.acquire` span. The first key that
//! stays busy, times out or errors ends the attempt: the guards taken so far are released,
//! awaited (`give_back`), so a caller sees them free when the error reaches it; a dropped
//! acquire future drops them (drop-release). Before the guards are handed over, every one must be live (`is_held`): a key taken early may
//! have lapsed or been lost while a later key was waited for. Then every key is given back and
//! the acquisition starts over in canonical order within the one wait (`stale_grant`, `reason =
//! lapsed`); when the wait has run out, the lapsed key is the one named in the `Timeout`. The
//! single-Redis one-call path goes through the same check. The result is a `MultiGuard`: a `Vec<LockGuard>`
//! in canonical order; `lost()` polls every guard's lost future, `release()` releases them last
//! first and keeps the first error, `scope()` pushes one reentrancy frame per lease
//! (`scope::inside_all`). The macro's `keys = [..]` expands to `MultiLock::new([...])` and
//! the same `__private::run_body` / `finish` as one key, generic over `BodyGuard`.
//!
//! A backend that takes every key in one call (the `AllKeysBackend`
//! capability, `LockBackend::all_keys`: a single Redis server) goes through
//! `multi_at_once.rs` instead: the local turns key by key in canonical order,
//! then every key in one call (one script, `redis/all_keys.rs`), each returned
//! lease registered as `take` registers one. Cluster, Redlock, etcd, ZooKeeper
//! and PostgreSQL keep the key-by-key path.

use std::fmt;
use std::time::{Duration, Instant};

use tracing::{Instrument, Span};

use crate::lease::observe::{Kind, StaleReason};
use crate::lease::options::{lease_option_setters, LeaseOptions};
use crate::locks::multi_at_once::{take_all, NotTaken};
use crate::locks::multi_guard::MultiGuard;
use crate::locks::within::lock_watched;
use crate::{backend::deadline, lease::observe, LockError, LockGuard};

/// A lock on several keys at once: [`acquire`](Self::acquire) holds every
/// key or none.
///
/// The keys are taken in one canonical order, sorted byte-wise with
/// duplicates removed (a duplicate is the same key string, byte for byte;
/// `"account:1"` and `"account:01"` are two keys). Every `MultiLock` over
/// overlapping keys therefore takes them in the same order whatever order
/// its caller named them in, which is what rules out a deadlock between
/// two of them. (A key already held *outside* the multi-lock breaks the
/// order like any hand-made lock order would; inside a held guard's
/// [`scope`](LockGuard::scope) that key re-enters and is not waited for.)
///
/// Each key is taken as a [`Lock`](crate::Lock) on it would be: the local
/// queue, reentrancy inside a guard's scope, renewal, its own
/// `dlock.acquire` span (under one `dlock.acquire_all` span) and its own
/// fencing token. When a key is busy ([`try_acquire`](Self::try_acquire)),
/// the one `wait` runs out, an error occurs or the acquire future is
/// dropped, the keys already taken are given back.
///
/// Options are those of [`Lock`](crate::Lock): [`ttl`](Self::ttl),
/// [`wait`](Self::wait) (for all keys together), [`renew`](Self::renew),
/// [`backend`](Self::backend), [`with_backend`](Self::with_backend). Every
/// key is on the same backend.
///
/// ```
/// use dlock::MultiLock;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let transfer = MultiLock::new(["account:2", "account:1"]).wait(Duration::from_secs(5));
/// let guard = transfer.acquire().await?;
/// assert_eq!(guard.keys().collect::<Vec<_>>(), ["account:1", "account:2"]);
/// // Another caller naming the keys the other way round finds them held.
/// assert!(MultiLock::new(["account:1", "account:2"]).try_acquire().await?.is_none());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// The options; `key` holds the keys joined by `, ` (for `Debug`), each
    /// key's lock uses these with its own key.
    options: LeaseOptions,
    /// The canonical order: sorted, without duplicates.
    keys: Vec<String>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("keys", &self.keys)
            .field("options", &self.options)
            .finish()
    }
}

/// Why a multi-key acquisition did not end with every key held.
enum Blocked {
    /// This key was held by someone else for the whole wait.
    By(String),
    /// This key's acquisition failed.
    Failed(String, LockError),
}

impl MultiLock {
    /// The most keys one multi-lock may take: 1024. More (or none) is
    /// [`LockError::InvalidOption`] at acquire.
    pub const MAX_KEYS: usize = 1024;

    /// A lock on every key of `keys` with the default options. The keys are
    /// put in canonical order now (sorted, duplicates removed) and checked
    /// when the lock is acquired ([`LockError::InvalidKey`], or
    /// [`LockError::InvalidOption`] when there are none).
    pub fn new<I>(keys: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let mut keys: Vec<String> = keys.into_iter().map(Into::into).collect();
        keys.sort_unstable();
        keys.dedup();
        MultiLock {
            options: LeaseOptions::new(keys.join(", ")),
            keys,
        }
    }

    lease_option_setters! {
        ttl: "The lease length of each key's lease (see [`Lock::ttl`](crate::Lock::ttl)).",
        wait: "How long [`acquire`](Self::acquire) may wait for all the keys
together. `Duration::ZERO` tries each key once and fails with
[`LockError::Busy`] if one is held.",
        renew: "Renewal by the watchdog (on by default; see [`Lock::renew`](crate::Lock::renew)).",
    }

    /// The keys in the order they are taken: sorted, without duplicates.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Takes every key, waiting up to the configured `wait` for all of them
    /// together; on failure no key is left held.
    ///
    /// # Errors
    /// [`LockError::Timeout`] (naming the key still held by someone else)
    /// when the wait runs out, [`LockError::Busy`] when the wait is zero and
    /// a key is held, [`LockError::InvalidOption`] for no keys or more than
    /// [`MAX_KEYS`](Self::MAX_KEYS) or a bad ttl, [`LockError::InvalidKey`],
    /// [`LockError::NoBackend`], [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// Dropping the future gives back the keys taken so far (released in
    /// the background) and leaves no queue entry behind.
    pub async fn acquire(&self) -> Result<MultiGuard, LockError> {
        let start = Instant::now();
        let wait = self.options.wait;
        match self.watched(wait).await? {
            Ok(guard) => Ok(guard),
            Err(key) if wait == Some(Duration::ZERO) => Err(LockError::Busy { key }),
            Err(key) => Err(LockError::Timeout {
                key,
                waited: start.elapsed(),
            }),
        }
    }

    /// One attempt per key that never waits: `Ok(None)` if a key is held by
    /// someone else (the keys taken before it are given back).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), but never `Busy` or `Timeout`.
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>, LockError> {
        Ok(self.watched(Some(Duration::ZERO)).await?.ok())
    }

    /// Checks the keys, then takes them in the `dlock.acquire_all` span.
    /// `Ok(Err(key))`: `key` stayed held by someone else.
    async fn watched(
        &self,
        wait: Option<Duration>,
    ) -> Result<Result<MultiGuard, String>, LockError> {
        self.check()?;
        let span = observe::acquire_all_span(&self.keys, &self.options.label(), wait);
        let mut watch = Watch {
            span: span.clone(),
            start: Instant::now(),
            finished: false,
        };
        let taken = self.take_in_order(wait).instrument(span).await;
        let (outcome, blocked_on) = match &taken {
            Ok(_) => ("acquired", None),
            Err(Blocked::By(key)) if wait == Some(Duration::ZERO) => ("busy", Some(key.as_str())),
            Err(Blocked::By(key)) => ("timeout", Some(key.as_str())),
            Err(Blocked::Failed(key, _)) => ("error", Some(key.as_str())),
        };
        watch.finish(outcome, blocked_on);
        match taken {
            Ok(guards) => Ok(Ok(MultiGuard::new(guards))),
            Err(Blocked::By(key)) => Ok(Err(key)),
            Err(Blocked::Failed(_, error)) => Err(error),
        }
    }

    /// Takes every key within one deadline, and hands the guards over only
    /// if every lease is live at that instant: a key taken early may lapse
    /// (its ttl, with renewal off) or be lost (a refused renewal, a
    /// failover, an operator's `DEL`) while the acquisition waits for a
    /// later key. Then every key is given back and the whole acquisition
    /// starts over within the wait (in canonical order again, so the
    /// deadlock freedom holds); when the wait has run out, the lapsed key is
    /// the one named.
    async fn take_in_order(&self, wait: Option<Duration>) -> Result<Vec<LockGuard>, Blocked> {
        let deadline = wait.and_then(deadline::after);
        let once = wait == Some(Duration::ZERO);
        loop {
            let guards = self.take_each(left_of(once, deadline)).await?;
            let Some(lapsed) = guards.iter().find(|g| !g.is_held()) else {
                return Ok(guards);
            };
            let key = lapsed.key().to_owned();
            let lease = lapsed.lease();
            let late_by =
                Instant::now().saturating_duration_since(lease.lock_state().lease.valid_until);
            observe::stale_grant(
                &key,
                lease.label(),
                Kind::Lock,
                StaleReason::Lapsed,
                late_by,
            );
            give_back(guards).await;
            if once || deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Blocked::By(key));
            }
        }
    }

    /// One pass over the keys, within `wait`: one by one in canonical order
    /// through the core's acquire path. On any failure the keys taken so
    /// far are released (awaited, so a caller that checks right after sees
    /// them free); if this future is dropped, the guards it holds release
    /// on drop.
    ///
    /// This is the one place that decides how the keys are taken: a
    /// backend able to take several keys in one call (one Redis script:
    /// [`AllKeysBackend`](crate::backend::AllKeysBackend)) is asked for
    /// them all at once, after the local turns (`multi_at_once.rs`);
    /// every other backend is asked key by key.
    async fn take_each(&self, wait: Option<Duration>) -> Result<Vec<LockGuard>, Blocked> {
        // The keys were checked; the joined `options.key` is no key to check.
        let first = self.options.with_key(self.keys[0].clone());
        let backend = first
            .check()
            .map_err(|e| Blocked::Failed(self.keys[0].clone(), e))?;
        if let Some(all) = backend.all_keys() {
            return take_all(&self.options, &self.keys, &backend, all, wait)
                .await
                .map_err(|not| match not {
                    NotTaken::Held(at) => Blocked::By(self.keys[at].clone()),
                    NotTaken::Failed(at, e) => Blocked::Failed(self.keys[at].clone(), e),
                });
        }
        let deadline = wait.and_then(deadline::after);
        let once = wait == Some(Duration::ZERO);
        let mut held: Vec<LockGuard> = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            // Each key gets what is left of the pass's wait.
            let options = self.options.with_key(key.clone());
            let blocked = match lock_watched(&options, left_of(once, deadline)).await {
                Ok(Some(guard)) => {
                    held.push(guard);
                    continue;
                }
                Ok(None) => Blocked::By(key.clone()),
                Err(error) => Blocked::Failed(key.clone(), error),
            };
            give_back(held).await;
            return Err(blocked);
        }
        Ok(held)
    }

    fn check(&self) -> Result<(), LockError> {
        if self.keys.is_empty() {
            return Err(LockError::invalid_option(
                "a MultiLock needs at least one key: pass the keys to lock, e.g. MultiLock::new([\"account:1\", \"account:2\"])",
            ));
        }
        if self.keys.len() > Self::MAX_KEYS {
            return Err(LockError::invalid_option(format!(
                "a MultiLock of {} keys is more than the {} allowed (dlock::MultiLock::MAX_KEYS); lock fewer keys, or a coarser key that covers them",
                self.keys.len(),
                Self::MAX_KEYS
            )));
        }
        // Every key is checked before the first is taken (a bad last key
        // must not cost a round trip per key before it), and before the
        // options, so a bad key is named whatever else is wrong, as for a
        // `Lock`.
        for key in &self.keys {
            crate::backend::key::validate(key)?;
        }
        self.options.with_key(self.keys[0].clone()).check()?;
        Ok(())
    }
}

/// What is left of a wait that ends at `deadline`: a wait with no limit
/// stays without one, a single attempt (`once`) stays single.
fn left_of(once: bool, deadline: Option<Instant>) -> Option<Duration> {
    match (once, deadline) {
        (true, _) => Some(Duration::ZERO),
        (false, Some(deadline)) => Some(deadline.saturating_duration_since(Instant::now())),
        (false, None) => None,
    }
}

/// Releases the guards of a multi-key acquisition that did not complete,
/// last taken first. A failed release is left to the lease's ttl: the
/// caller's error is about the key that could not be taken.
async fn give_back(held: Vec<LockGuard>) {
    for guard in held.into_iter().rev() {
        let _ = guard.release().await;
    }
}

/// The `dlock.acquire_all` span's outcome; dropped unfinished, the
/// acquisition was cancelled.
struct Watch {
    span: Span,
    start: Instant,
    finished: bool,
}

impl Watch {
    fn finish(&mut self, outcome: &str, blocked_on: Option<&str>) {
        self.finished = true;
        observe::acquired_all(&self.span, self.start, outcome, blocked_on);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.finished {
            observe::acquired_all(&self.span, self.start, "cancelled", None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_and_deduplicated() {
        let lock = MultiLock::new(vec!["b".to_owned(), "a".into(), "b".into(), "c".into()]);
        assert_eq!(lock.keys(), ["a", "b", "c"]);
        assert_eq!(MultiLock::new(["x"]).keys(), ["x"]);
    }
}
