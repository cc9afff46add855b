//! `SegmentedLock`: one hot resource split into N independently locked
//! segments (the "split the stock" pattern of flash sales).

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::lease::acquire;
use crate::lease::observe::Kind;
use crate::lease::options::{hold_at_least_setter, lease_option_setters, LeaseOptions};
use crate::locks::within::{held_here, lock_within};
use crate::{backend::deadline, lease::local, LockError, LockGuard};

/// A lock on one resource split into `segments` parts, each guarded by its
/// own ordinary lock on the key `<key>#<i>`.
///
/// A flash sale's one SKU with stock 1000 can be stored as 5 rows of 200;
/// each buyer needs only one row, so 5 buyers can sell at once instead of
/// one. `SegmentedLock` hands out whichever segment is free:
///
/// - [`acquire`](Self::acquire) starts at a rotating segment (a per-process
///   counter per key, so load spreads), tries every segment once without
///   waiting, and only if all are busy waits for the first one that frees —
///   on all segments at once, woken by the service, never polling.
/// - Inside one process at most `segments` tasks look for a segment at once;
///   the others queue locally (FIFO). Otherwise every local waiter would
///   queue on every segment in the same order, and the front one would win
///   several segments at once only to give all but one back.
/// - [`acquire_segment`](Self::acquire_segment) takes one segment explicitly
///   (e.g. to move stock between segments, or to retry on another one).
/// - The guard is a [`LockGuard`] whose [`segment`](LockGuard::segment) says
///   which part is held; its key is `<key>#<i>` and its fencing token counts
///   per segment. Every backend that has locks has segmented locks.
///
/// Options are those of [`Lock`](crate::Lock): [`ttl`](Self::ttl), [`wait`](Self::wait)
/// (for the whole acquisition), [`renew`](Self::renew),
/// [`backend`](Self::backend), [`with_backend`](Self::with_backend).
///
/// **When to use which**: a [`Lock`](crate::Lock) when the protected state cannot be
/// split; a `SegmentedLock` when it can be split into parts that each hold
/// their own state (stock rows, counter shards), so holders of different
/// parts never touch the same data; a [`Semaphore`](crate::Semaphore) when
/// up to N holders may work at once on shared state that is itself safe for
/// concurrent use (it limits concurrency; it does not say which part is yours).
///
/// ```
/// use dlock::SegmentedLock;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let stock = SegmentedLock::new("stock:10001", 5);
/// let a = stock.acquire().await?;
/// let b = tokio::spawn({ let stock = stock.clone(); async move { stock.acquire().await } })
///     .await.unwrap()?;
/// assert_ne!(a.segment(), b.segment()); // two buyers, two segments, no waiting
/// println!("selling from row {:?}", a.segment());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SegmentedLock {
    /// The key and options; each segment's lock is these with key `<key>#<i>`.
    options: LeaseOptions,
    segments: usize,
}

/// Per-process rotation counters. A fixed table indexed by the key's hash
/// keeps memory bounded however many keys a process locks; two keys that
/// share a counter still rotate, each just skips some starting points.
static ROTATION: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];

fn rotation(key: &str) -> &'static AtomicUsize {
    // `DefaultHasher::new` uses fixed keys: a key always maps to one counter.
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    &ROTATION[(hasher.finish() % ROTATION.len() as u64) as usize]
}

type SegmentWait<'a> =
    Pin<Box<dyn Future<Output = (usize, Result<Option<LockGuard>, LockError>)> + Send + 'a>>;

impl SegmentedLock {
    /// The most segments a segmented lock may have: 1024. More (or zero) is
    /// [`LockError::InvalidOption`] at acquire; every acquire may try each
    /// segment once.
    pub const MAX_SEGMENTS: usize = 1024;

    /// A lock on `key` split into `segments` segments, with the default
    /// options. Nothing is checked until it is acquired: zero segments is
    /// [`LockError::InvalidOption`] then, a bad key [`LockError::InvalidKey`].
    pub fn new(key: impl Into<String>, segments: usize) -> Self {
        SegmentedLock {
            options: LeaseOptions::new(key.into()),
            segments,
        }
    }

    lease_option_setters! {
        ttl: "The lease length of each segment's lease (see [`Lock::ttl`](crate::Lock::ttl)).",
        wait: "How long [`acquire`](Self::acquire) may wait for any segment.
`Duration::ZERO`: every segment is tried once, then
[`LockError::Busy`].",
        renew: "Renewal by the watchdog (on by default; see [`Lock::renew`](crate::Lock::renew)).",
    }

    hold_at_least_setter!(
        type: "SegmentedLock",
        new: r#"SegmentedLock::new("report:nightly", 4)"#,
        then: ""
    );

    /// The key the segments are named after.
    pub fn key(&self) -> &str {
        &self.options.key
    }

    /// How many segments.
    pub fn segments(&self) -> usize {
        self.segments
    }

    /// The key of segment `index`: `<key>#<index>`.
    pub fn segment_key(&self, index: usize) -> String {
        format!("{}#{index}", self.options.key)
    }

    /// Takes a free segment, waiting up to the configured `wait` for one.
    ///
    /// Inside the critical section of a guard that holds one of the segments
    /// ([`LockGuard::scope`], a `#[distributed_lock]` body), that segment is
    /// granted again at once (reentrancy, as with [`Lock`](crate::Lock)), so a locked
    /// function that calls another with the same key does not take a second
    /// segment. Elsewhere, a second acquire takes another segment.
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for zero segments or a bad ttl,
    /// [`LockError::Timeout`] when no segment freed within the wait,
    /// [`LockError::Busy`] when the wait is zero and every segment is held,
    /// [`LockError::InvalidKey`], [`LockError::NoBackend`],
    /// [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// As [`Lock::acquire`](crate::Lock::acquire): dropping the future leaves no segment held and
    /// no queue entry behind.
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        acquire::acquire(&self.options, Kind::Segment, |wait| {
            self.acquire_within(wait)
        })
        .await
    }

    /// Tries every segment once, never waiting: `Ok(None)` if all are held.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), but never `Busy` or `Timeout`.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        acquire::try_acquire(&self.options, Kind::Segment, |wait| {
            self.acquire_within(wait)
        })
        .await
    }

    /// Takes segment `index` (`0..segments`), waiting up to the configured
    /// `wait` for it; errors name the segment's key.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::connect("memory://").await?;
    /// let stock = dlock::SegmentedLock::new("stock:7", 4).with_backend(backend);
    /// let row = stock.acquire_segment(2).await?;
    /// assert_eq!((row.segment(), row.key()), (Some(2), "stock:7#2"));
    /// assert!(stock.acquire_segment(4).await.is_err()); // there is no segment 4
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] if `index >= segments`; otherwise as
    /// [`Lock::acquire`](crate::Lock::acquire).
    ///
    /// # Cancel safety
    /// As [`Lock::acquire`](crate::Lock::acquire).
    pub async fn acquire_segment(&self, index: usize) -> Result<LockGuard, LockError> {
        self.check()?;
        if index >= self.segments {
            return Err(LockError::invalid_option(format!(
                "segment {index} of `{}` does not exist: it has {} segments, numbered 0..{}",
                self.key(),
                self.segments,
                self.segments
            )));
        }
        let segment = self.options.with_key(self.segment_key(index));
        let guard = acquire::acquire(&segment, Kind::Segment, |wait| {
            lock_within(&segment, wait, Kind::Segment)
        })
        .await?;
        Ok(guard.in_segment(index))
    }

    fn check(&self) -> Result<(), LockError> {
        if self.segments == 0 || self.segments > Self::MAX_SEGMENTS {
            return Err(LockError::invalid_option(format!(
                "`{}` has {} segments; a segmented lock needs 1..={} (dlock::SegmentedLock::MAX_SEGMENTS)",
                self.key(),
                self.segments,
                Self::MAX_SEGMENTS
            )));
        }
        // The base key itself must be valid, not only `<key>#<i>` (an empty
        // key would otherwise become the valid key `#0`); and so must the
        // longest segment key, which the suffix makes longer than the base.
        crate::backend::key::validate(self.key())?;
        let longest = self.segment_key(self.segments - 1);
        crate::backend::key::validate(&longest).map_err(|e| match e {
            LockError::InvalidKey { reason, .. } => LockError::InvalidKey {
                key: self.key().to_owned(),
                reason: format!(
                    "its segment key `…#{}` is invalid: {reason}; the base key must leave room for the `#<segment>` suffix",
                    self.segments - 1
                ),
            },
            other => other,
        })
    }

    async fn acquire_within(&self, wait: Option<Duration>) -> Result<Option<LockGuard>, LockError> {
        self.check()?;
        let n = self.segments;
        let locks: Vec<LeaseOptions> = (0..n)
            .map(|i| self.options.with_key(self.segment_key(i)))
            .collect();
        for (i, lock) in locks.iter().enumerate() {
            if let Some(guard) = held_here(lock)? {
                return Ok(Some(guard.in_segment(i)));
            }
        }
        // Local admission: at most `n` tasks of this process look for a
        // segment at once, the rest queue here (FIFO). Without it every local
        // waiter queues on every segment's local gate in the same order, so
        // the front waiter gets several segments at once and all but one of
        // those acquisitions are wasted.
        let backend = self.options.check()?;
        let local = local::for_backend(&backend);
        let deadline = wait.and_then(deadline::after);
        let once = wait == Some(Duration::ZERO);
        let slot = local.queue.segments_slot(self.key(), n);
        let Some(admission) = local.queue.turn(slot, once, deadline).await else {
            return Ok(None);
        };
        // The admission goes back with the segment's lease (released or
        // lost), or here when no segment was found.
        let guard = self.find_segment(&locks, wait, deadline).await?;
        Ok(guard.map(|guard| guard.admitted(admission)))
    }

    /// Tries every segment once from a rotating start, then, unless `wait`
    /// is zero, waits on all of them at once until `deadline`.
    async fn find_segment(
        &self,
        locks: &[LeaseOptions],
        wait: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>, LockError> {
        let n = locks.len();
        let first = rotation(self.key()).fetch_add(1, Ordering::Relaxed) % n;
        let order: Vec<usize> = (0..n).map(|j| (first + j) % n).collect();
        for &i in &order {
            if let Some(guard) = lock_within(&locks[i], Some(Duration::ZERO), Kind::Segment).await?
            {
                return Ok(Some(guard.in_segment(i)));
            }
        }
        if wait == Some(Duration::ZERO) {
            return Ok(None);
        }
        // Every segment is busy: wait on all of them at once.
        let waits = order
            .iter()
            .map(|&i| {
                let lock = &locks[i];
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                Box::pin(async move { (i, lock_within(lock, left, Kind::Segment).await) })
                    as SegmentWait<'_>
            })
            .collect();
        first_winner(waits).await
    }
}

/// Polls every segment's wait and returns the first that acquires.
///
/// It returns in the same poll in which a wait completes with a guard, so a
/// second wait is never polled to completion after a winner: there is no
/// second guard to leak. The waits still pending are dropped with the
/// vector; `Lock::acquire` is cancel safe, so they leave no queue entry and
/// a lease granted at the instant of the drop is released in the background.
/// An error from any segment ends the wait with that error; `Ok(None)` only
/// once every segment timed out.
async fn first_winner(mut waits: Vec<SegmentWait<'_>>) -> Result<Option<LockGuard>, LockError> {
    let mut done = vec![false; waits.len()];
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for (wait, done) in waits.iter_mut().zip(done.iter_mut()) {
            if *done {
                continue;
            }
            match wait.as_mut().poll(cx) {
                Poll::Ready((i, Ok(Some(guard)))) => {
                    return Poll::Ready(Ok(Some(guard.in_segment(i))))
                }
                Poll::Ready((_, Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready((_, Ok(None))) => *done = true,
                Poll::Pending => all_done = false,
            }
        }
        if all_done {
            Poll::Ready(Ok(None))
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::memory::MemoryBackend;
    use crate::LockBackend;
    use std::sync::Arc;

    fn backend() -> Arc<dyn LockBackend> {
        Arc::new(MemoryBackend::new())
    }

    #[tokio::test]
    async fn zero_segments_and_bad_indexes_are_invalid_options() {
        let b = backend();
        let none = SegmentedLock::new("k", 0).with_backend(b.clone());
        for err in [
            none.acquire().await.unwrap_err(),
            none.try_acquire().await.unwrap_err(),
            none.acquire_segment(0).await.unwrap_err(),
            SegmentedLock::new("k", 3)
                .with_backend(b.clone())
                .acquire_segment(3)
                .await
                .unwrap_err(),
        ] {
            assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        }
        let err = SegmentedLock::new("", 2)
            .with_backend(b)
            .acquire()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn hands_out_every_segment_then_reports_busy() {
        let b = backend();
        let lock = SegmentedLock::new("seg:busy", 3)
            .with_backend(b)
            .wait(Duration::ZERO);
        let mut held = Vec::new();
        for _ in 0..3 {
            let lock = lock.clone();
            held.push(
                tokio::spawn(async move { lock.acquire().await })
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        let mut segments: Vec<_> = held.iter().map(|g| g.segment().unwrap()).collect();
        segments.sort_unstable();
        assert_eq!(segments, [0, 1, 2]);
        let l = lock.clone();
        let busy = tokio::spawn(async move { l.acquire().await })
            .await
            .unwrap();
        assert!(matches!(busy, Err(LockError::Busy { ref key }) if key == "seg:busy"));
        let l = lock.clone();
        assert!(tokio::spawn(async move { l.try_acquire().await })
            .await
            .unwrap()
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn the_holders_scope_gets_its_own_segment_back() {
        let lock = SegmentedLock::new("seg:reentrant", 4).with_backend(backend());
        let outer = lock.acquire().await.unwrap();
        let inner = outer.scope(lock.acquire()).await.unwrap();
        assert!(inner.is_reentrant());
        assert_eq!(inner.segment(), outer.segment());
        // Outside the scope, a second acquire takes another segment.
        let other = lock.acquire().await.unwrap();
        assert!(!other.is_reentrant());
        assert_ne!(other.segment(), outer.segment());
    }

    #[tokio::test]
    async fn waits_for_whichever_segment_frees_first() {
        let lock = SegmentedLock::new("seg:wait", 2).with_backend(backend());
        let a = lock.acquire_segment(0).await.unwrap();
        let b = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.acquire_segment(1).await })
                .await
                .unwrap()
                .unwrap()
        };
        let waiter = {
            let lock = lock.clone().wait(Duration::from_secs(5));
            tokio::spawn(async move {
                let guard = lock.acquire().await;
                (Instant::now(), guard)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let freed = Instant::now();
        b.release().await.unwrap();
        let (got, guard) = waiter.await.unwrap();
        assert_eq!(guard.unwrap().segment(), Some(1));
        assert!(
            got - freed < Duration::from_millis(500),
            "{:?}",
            got - freed
        );
        drop(a);
    }

    #[tokio::test]
    async fn times_out_when_no_segment_frees() {
        let lock = SegmentedLock::new("seg:timeout", 2).with_backend(backend());
        let _a = lock.acquire_segment(0).await.unwrap();
        let other = lock.clone();
        let _b = tokio::spawn(async move { other.acquire_segment(1).await })
            .await
            .unwrap()
            .unwrap();
        let lock = lock.wait(Duration::from_millis(100));
        let start = Instant::now();
        let err = tokio::spawn(async move { lock.acquire().await })
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
        assert!(start.elapsed() >= Duration::from_millis(100));
    }

    #[test]
    fn rotation_counters_are_stable_per_key() {
        assert!(std::ptr::eq(rotation("stock:1"), rotation("stock:1")));
    }

    #[tokio::test]
    async fn distinct_keys_leave_no_admission_slots_behind() {
        let b: Arc<dyn LockBackend> = backend();
        let local = local::for_backend(&b);
        for i in 0..2_000 {
            let lock = SegmentedLock::new(format!("seg:many:{i}"), 2).with_backend(b.clone());
            let guard = lock.acquire().await.unwrap();
            if i % 2 == 0 {
                guard.release().await.unwrap();
            } else {
                drop(guard);
            }
            // A try that finds nothing, and a wait that times out, too.
            let _ = lock.clone().wait(Duration::ZERO).try_acquire().await;
        }
        for _ in 0..100 {
            if local.slot_count() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(local.slot_count(), 0, "admission slots were kept");
    }

    #[tokio::test]
    async fn a_later_segment_count_is_not_stuck_at_the_first() {
        let b: Arc<dyn LockBackend> = backend();
        let one = SegmentedLock::new("seg:count", 1).with_backend(b.clone());
        one.acquire().await.unwrap().release().await.unwrap();
        let two = SegmentedLock::new("seg:count", 2).with_backend(b.clone());
        let first = two.acquire().await.unwrap();
        let second = tokio::spawn({
            let two = two.clone().wait(Duration::from_secs(1));
            async move { two.acquire().await }
        })
        .await
        .unwrap()
        .expect("a second local holder of a 2-segment lock");
        assert_ne!(first.segment(), second.segment());
    }
}
