//! The kinds of lock a user holds: what each lease means and the guard that
//! holds it. Each is a facade over the one acquire path in [`crate::lease`].
//!
//! - `lock.rs`: [`Lock`](crate::Lock), one key, one holder.
//! - `segmented.rs`, `semaphore.rs`: hot keys, N holders (`SegmentedLock`,
//!   `Semaphore` and its `Permit`).
//! - `rwlock.rs`: shared readers, one writer.
//! - `multi.rs` (+ `multi_at_once.rs`, the backends that take every key in one
//!   call, and `multi_guard.rs`): several keys in an order that cannot deadlock.
//! - `election.rs`: one leader at a time, its term a fence.
//! - `count_down_latch.rs`: a count the service holds, waiters woken at zero.
//! - `guard.rs`: [`LockGuard`](crate::LockGuard), release on drop, `lost()`.
//! - `ensure.rs`: `ensure()` on every guard, the check before a side effect.
//! - `scope.rs`: reentrancy, the holder's own critical section as a task-local scope.
//! - `within.rs`: the way into the acquire path, reentrant where the caller's
//!   scope holds the key; the taken lease made a [`LockGuard`](crate::LockGuard).

pub(crate) mod barrier;
pub(crate) mod count_down_latch;
pub(crate) mod election;
pub(crate) mod ensure;
pub(crate) mod guard;
pub(crate) mod lock;
pub(crate) mod multi;
pub(crate) mod multi_at_once;
pub(crate) mod multi_guard;
pub(crate) mod rwlock;
pub(crate) mod scope;
pub(crate) mod segmented;
pub(crate) mod semaphore;
pub(crate) mod within;
