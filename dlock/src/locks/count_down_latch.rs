//! `CountDownLatch`: a count on the service that processes count down, and
//! whose waiters the service wakes when it reaches zero.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::backend::{no_latches, LatchBackend, LockBackend};
use crate::lease::observe::latch::{LatchCall, LatchOp, LatchOutcome};
use crate::lease::options::{BackendChoice, LeaseOptions};
use crate::LockError;

/// A distributed count-down latch: "start the migration once all 5 shards
/// reported ready".
///
/// One process sets a count ([`try_set_count`](Self::try_set_count)),
/// others [`count_down`](Self::count_down), and every
/// [`wait_zero`](Self::wait_zero) returns once the count is zero. The count
/// lives on the service, shared by every process that uses the same name on
/// the same backend.
///
/// - The count never goes below zero: a `count_down` at zero (or on an
///   unset latch) does nothing.
/// - [`try_set_count`](Self::try_set_count) answers `false` while a count
///   is live; a latch that reached zero may be set again.
/// - Waiters are woken by the service (pub/sub, an etcd watch, `NOTIFY`), never
///   by polling, and the waiters of one name in one process share one
///   subscription.
/// - The count has no lease: a process that dies before its `count_down`
///   leaves the waiters waiting until their [`wait`](Self::wait) ends.
/// - With `?layout=redisson` on Redis, the latch is Redisson's
///   `RCountDownLatch` of the same name (see [`crate::guide::interop`]).
/// - Backends: memory, Redis, etcd, ZooKeeper, PostgreSQL and files. Others fail with
///   [`LockError::InvalidOption`] ("… has no count-down latches").
///
/// Options: [`wait`](Self::wait) (how long `wait_zero` waits; default no
/// limit), [`backend`](Self::backend), [`with_backend`](Self::with_backend).
///
/// ```
/// use dlock::CountDownLatch;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://").await?;
/// let shards = CountDownLatch::new("migration:shards-ready")
///     .with_backend(backend)
///     .wait(Duration::from_secs(30));
/// assert!(shards.try_set_count(2).await?);
/// assert!(!shards.try_set_count(5).await?); // a count is live
/// let waiter = tokio::spawn({
///     let shards = shards.clone();
///     async move { shards.wait_zero().await }
/// });
/// shards.count_down().await?;
/// assert_eq!(shards.count().await?, 1);
/// shards.count_down().await?;
/// waiter.await.unwrap()?; // returned once the count reached zero
/// assert_eq!(shards.count().await?, 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CountDownLatch {
    /// The name (as a key), the wait and the backend; the ttl is unused.
    options: LeaseOptions,
}

impl CountDownLatch {
    /// The largest count: 2^53 − 1, exact in every store (Lua numbers,
    /// JSON, Java's `long`). A larger count is [`LockError::InvalidOption`].
    pub const MAX_COUNT: u64 = (1 << 53) - 1;

    /// A latch named `name` with the default options. Nothing is checked
    /// until it is used: a bad name is [`LockError::InvalidKey`] then (names
    /// follow the rules of lock keys).
    pub fn new(name: impl Into<String>) -> Self {
        CountDownLatch {
            options: LeaseOptions::new(name.into()),
        }
    }

    /// How long [`wait_zero`](Self::wait_zero) may wait before
    /// [`LockError::Timeout`]. Default: no limit (`Duration::MAX` is no
    /// limit too); `Duration::ZERO`: one look at the count.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// Uses the backend registered under `name` in [`registry()`](crate::registry()).
    pub fn backend(mut self, name: impl Into<String>) -> Self {
        self.options.backend = BackendChoice::Named(Arc::from(name.into()));
        self
    }

    /// Uses this backend, bypassing the registry.
    pub fn with_backend(mut self, backend: Arc<dyn LockBackend>) -> Self {
        self.options.backend = BackendChoice::given(backend);
        self
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        &self.options.key
    }

    /// Sets the count to `count` if the latch is at zero or unset: `true`;
    /// `false` while a count is live (nothing changes then).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a count of 0 or above
    /// [`MAX_COUNT`](Self::MAX_COUNT), or a backend without latches;
    /// [`LockError::InvalidKey`], [`LockError::NoBackend`],
    /// [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// The count is set in one atomic step on the service: dropping the
    /// future leaves it set or not, never half.
    pub async fn try_set_count(&self, count: u64) -> Result<bool, LockError> {
        let call = self.start(LatchOp::SetCount);
        call.count(count);
        let result = async {
            if count == 0 || count > Self::MAX_COUNT {
                return Err(LockError::invalid_option(format!(
                    "count {count} for latch `{}`: give 1..={} (dlock::CountDownLatch::MAX_COUNT)",
                    self.name(),
                    Self::MAX_COUNT
                )));
            }
            let backend = self.options.check()?;
            latch_of(&*backend)?.try_set_count(self.name(), count).await
        }
        .instrument(call.span().clone())
        .await;
        call.finish(match result {
            Ok(true) => LatchOutcome::Set,
            Ok(false) => LatchOutcome::Live,
            Err(_) => LatchOutcome::Error,
        });
        result
    }

    /// Takes one from the count; at zero or unset, nothing (never below
    /// zero). The step that reaches zero wakes every waiter.
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a backend without latches;
    /// [`LockError::InvalidKey`], [`LockError::NoBackend`],
    /// [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// One atomic step on the service: dropping the future counts down once
    /// or not at all.
    pub async fn count_down(&self) -> Result<(), LockError> {
        let call = self.start(LatchOp::CountDown);
        let result = async {
            let backend = self.options.check()?;
            latch_of(&*backend)?.count_down(self.name()).await
        }
        .instrument(call.span().clone())
        .await;
        call.finish(done(&result));
        result
    }

    /// The count now: 0 when unset.
    ///
    /// # Errors
    /// As [`count_down`](Self::count_down).
    ///
    /// # Cancel safety
    /// A read: dropping the future changes nothing.
    pub async fn count(&self) -> Result<u64, LockError> {
        let call = self.start(LatchOp::Count);
        let result = async {
            let backend = self.options.check()?;
            latch_of(&*backend)?.count(self.name()).await
        }
        .instrument(call.span().clone())
        .await;
        if let Ok(count) = &result {
            call.count(*count);
        }
        call.finish(done(&result));
        result
    }

    /// Waits until the count is zero: returns at once at zero or unset,
    /// else when the service announces zero, or fails with
    /// [`LockError::Timeout`] after the configured [`wait`](Self::wait).
    ///
    /// The waiter reads the count again when it is woken (as Redisson's
    /// `await` does): a latch set again in the instant between reaching
    /// zero and that read is waited for anew. Set a latch again only once
    /// its waiters are done with the last round (or use a new name per
    /// round).
    ///
    /// # Errors
    /// [`LockError::Timeout`]; as [`count_down`](Self::count_down) otherwise.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind: no state on the service,
    /// and its share of the process's subscription is given back.
    pub async fn wait_zero(&self) -> Result<(), LockError> {
        let call = self.start(LatchOp::WaitZero);
        let start = Instant::now();
        let deadline = self.options.wait.and_then(crate::backend::deadline::after);
        let result = async {
            let backend = self.options.check()?;
            latch_of(&*backend)?.wait_zero(self.name(), deadline).await
        }
        .instrument(call.span().clone())
        .await;
        let result = match result {
            Ok(true) => Ok(()),
            Ok(false) => Err(LockError::Timeout {
                key: self.name().to_owned(),
                waited: start.elapsed(),
            }),
            Err(e) => Err(e),
        };
        call.finish(match &result {
            Ok(()) => LatchOutcome::Zero,
            Err(LockError::Timeout { .. }) => LatchOutcome::Timeout,
            Err(_) => LatchOutcome::Error,
        });
        result
    }

    fn start(&self, op: LatchOp) -> LatchCall {
        LatchCall::start(op, self.name(), self.options.label())
    }
}

fn latch_of(backend: &dyn LockBackend) -> Result<&dyn LatchBackend, LockError> {
    backend
        .latch()
        .ok_or_else(|| no_latches(&backend.describe()))
}

fn done<T>(result: &Result<T, LockError>) -> LatchOutcome {
    if result.is_ok() {
        LatchOutcome::Done
    } else {
        LatchOutcome::Error
    }
}
