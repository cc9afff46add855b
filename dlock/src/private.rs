//! What `#[distributed_lock]` expands to. Not a public API: no semver promise.

use std::future::Future;

#[path = "private/settings.rs"]
mod settings;
pub use settings::{backend_setting, duration_setting, BackendSetting, DurationSetting};

pub use crate::{Lock, LockError, LockGuard, MultiGuard, MultiLock, RwLock, SegmentedLock};

/// Whether a lost lease cancels the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body's future and return `Err(LockError::Lost)`.
    Cancel,
    /// Let the body run to its end.
    Continue,
}

/// The return type of a `#[distributed_lock]` function: a `Result` whose
/// error can be made from a [`LockError`].
#[cfg_attr(
    not(feature = "axum"),
    diagnostic::on_unimplemented(
        message = "`#[distributed_lock]` functions must return `Result<T, E>` where `E: From<dlock::LockError>`; found `{Self}`",
        label = "this return type cannot carry a `dlock::LockError`",
        note = "add `impl From<dlock::LockError> for YourError` (or a `#[from] dlock::LockError` variant with thiserror), or return `Result<T, dlock::LockError>`"
    )
)]
// With axum on, a handler returning `impl IntoResponse` lands here: the
// attribute cannot turn a lock error into an opaque type, and `HttpError`
// is the type made for it.
#[cfg_attr(
    feature = "axum",
    diagnostic::on_unimplemented(
        message = "`#[distributed_lock]` functions must return `Result<T, E>` where `E: From<dlock::LockError>`; found `{Self}`",
        label = "this return type cannot carry a `dlock::LockError`",
        note = "in an axum handler, return `Result<T, dlock::HttpError>` (it answers 409 for contention, 503 for an outage, with the error's text) or `Result<T, StatusCode>`; not `impl IntoResponse`, which the attribute cannot build a lock error into",
        note = "elsewhere, add `impl From<dlock::LockError> for YourError` (or a `#[from] dlock::LockError` variant with thiserror), or return `Result<T, dlock::LockError>`"
    )
)]
pub trait LockResult: Sized {
    /// The error value for a lock failure.
    fn from_lock_error(error: LockError) -> Self;
}

impl<T, E: From<LockError>> LockResult for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}

/// The function that turns a lock error into the return type `R`.
///
/// The expansion calls this once, spanned on the function's return type, so
/// a return type that cannot carry a [`LockError`] gets exactly one error,
/// there. Everything else takes the returned function and needs no bound.
pub fn fail_with<R: LockResult>() -> fn(LockError) -> R {
    R::from_lock_error
}

/// What the expansion holds while the body runs: one key's guard
/// ([`LockGuard`]: `key = ..`, with or without `mode` or `segments`) or
/// every key's ([`MultiGuard`]: `keys = [..]`). For the guards' own
/// methods, see those types.
pub trait BodyGuard: Sized {
    /// The `dlock.held` span the body runs in.
    fn held_span(&self) -> tracing::Span;
    fn is_held(&self) -> bool;
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static;
    fn scope<F: Future>(&self, body: F) -> impl Future<Output = F::Output>;
    /// The key a [`LockError::Lost`] names.
    fn lost_key(&self) -> String;
    /// Releases; a release failure is logged, not returned (see [`finish`]).
    fn release_after_body(self) -> impl Future<Output = ()>;
}

impl BodyGuard for LockGuard {
    fn held_span(&self) -> tracing::Span {
        crate::lease::observe::held_span(self.key(), self.fencing_token())
    }
    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        LockGuard::lost(self)
    }
    fn scope<F: Future>(&self, body: F) -> impl Future<Output = F::Output> {
        LockGuard::scope(self, body)
    }
    fn lost_key(&self) -> String {
        self.key().to_owned()
    }
    async fn release_after_body(self) {
        let key = self.key().to_owned();
        if let Some(error) = worth_a_warning(self.release().await) {
            tracing::warn!(key = %key, error = %error, "release after the body failed; the lease will expire by its ttl");
        }
    }
}

/// For `keys = [..]`: the body runs inside the critical section of every
/// key; a lost lease on any key is `Lost` naming it.
impl BodyGuard for MultiGuard {
    fn held_span(&self) -> tracing::Span {
        crate::lease::observe::held_all_span(self.guards())
    }
    fn is_held(&self) -> bool {
        MultiGuard::is_held(self)
    }
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        MultiGuard::lost(self)
    }
    fn scope<F: Future>(&self, body: F) -> impl Future<Output = F::Output> {
        MultiGuard::scope(self, body)
    }
    /// The first key whose lease is no longer held.
    fn lost_key(&self) -> String {
        let lost = self.guards().iter().find(|g| !g.is_held());
        lost.map_or_else(|| joined_keys(self), |g| g.key().to_owned())
    }
    async fn release_after_body(self) {
        let keys = joined_keys(&self);
        if let Some(error) = worth_a_warning(self.release().await) {
            tracing::warn!(keys = %keys, error = %error, "release after the body failed; the leases will expire by their ttl");
        }
    }
}

fn joined_keys(guard: &MultiGuard) -> String {
    guard.keys().collect::<Vec<_>>().join(", ")
}

/// The error of a release after the body, unless it only says the lease
/// was already gone (`NotHeld`).
fn worth_a_warning(released: Result<(), LockError>) -> Option<LockError> {
    released
        .err()
        .filter(|error| !matches!(error, LockError::NotHeld { .. }))
}

/// Runs `body` while the lease is held, inside the guard's critical section
/// (so nested acquisitions of the key re-enter). With [`OnLost::Cancel`], a
/// lost lease drops the body where it is awaiting and yields `fail(Lost)`.
pub async fn run_body<G, R, F>(guard: &G, on_lost: OnLost, fail: fn(LockError) -> R, body: F) -> R
where
    G: BodyGuard,
    F: Future<Output = R>,
{
    let span = guard.held_span();
    let body = tracing::Instrument::instrument(guard.scope(body), span);
    until_lost(
        body,
        on_lost,
        || guard.is_held(),
        || guard.lost(),
        || {
            fail(LockError::Lost {
                key: guard.lost_key(),
            })
        },
    )
    .await
}

/// Runs `body` (already in its scope and span) if the lease is live now
/// (`held()`), else yields `fail()` without polling it: a lease is handed to
/// a body only while it is held, whatever `on_lost` says, since a body does
/// its work up to its first `.await` on the first poll. With
/// [`OnLost::Cancel`], the loss future `lost()` is then polled before the
/// body each time, so a loss that has fired drops the body where it is
/// awaiting and yields `fail()`. `lost` is called only then: with
/// [`OnLost::Continue`] nothing watches the lease once the body runs.
async fn until_lost<R, L>(
    body: impl Future<Output = R>,
    on_lost: OnLost,
    held: impl FnOnce() -> bool,
    lost: impl FnOnce() -> L,
    fail: impl FnOnce() -> R,
) -> R
where
    L: Future<Output = ()>,
{
    if !held() {
        return fail();
    }
    match on_lost {
        OnLost::Continue => body.await,
        OnLost::Cancel => {
            let lost = lost();
            tokio::select! {
                biased;
                () = lost => fail(),
                output = body => output,
            }
        }
    }
}

/// Releases the guard before the function returns, so a caller that runs the
/// function twice in a row never contends with itself. A release failure does
/// not hide the body's result: the body's work is done either way, and the
/// lease expires by its ttl.
pub async fn finish<G: BodyGuard, R>(guard: G, output: R) -> R {
    guard.release_after_body().await;
    output
}

/// Emits every span, event and metric dlock has, once. For dlock's own test
/// that none of them allocates when nobody listens; not for users.
pub fn observe_everything_once() {
    crate::lease::observe::everything_once();
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A body whose lease is not held when it would start is never polled,
    /// whatever `on_lost` says: its first step (before any `.await`) would
    /// run without the lock.
    #[tokio::test]
    async fn a_body_is_not_started_without_its_lease() {
        for on_lost in [OnLost::Cancel, OnLost::Continue] {
            let ran = AtomicBool::new(false);
            let body = async {
                ran.store(true, Ordering::SeqCst);
                "body"
            };
            let out = until_lost(body, on_lost, || false, std::future::pending, || "lost").await;
            assert_eq!(out, "lost", "{on_lost:?}");
            assert!(!ran.load(Ordering::SeqCst), "{on_lost:?}: the body ran");
        }
    }

    /// A loss that has fired wins over a body that is ready at the same
    /// poll: the lease is not handed to it.
    #[tokio::test]
    async fn a_loss_that_fired_wins_over_a_ready_body() {
        let ran = AtomicBool::new(false);
        let body = async {
            ran.store(true, Ordering::SeqCst);
            "body"
        };
        let out = until_lost(
            body,
            OnLost::Cancel,
            || true,
            || std::future::ready(()),
            || "lost",
        )
        .await;
        assert_eq!(out, "lost");
        assert!(!ran.load(Ordering::SeqCst), "the body ran after the loss");
    }

    /// With the lease held and not lost, the body runs to its end.
    #[tokio::test]
    async fn a_held_lease_runs_the_body() {
        for on_lost in [OnLost::Cancel, OnLost::Continue] {
            let out = until_lost(
                async { "body" },
                on_lost,
                || true,
                std::future::pending,
                || "lost",
            )
            .await;
            assert_eq!(out, "body", "{on_lost:?}");
        }
    }
}
