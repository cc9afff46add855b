//! What a backend call of an acquisition sends and hears, told to whoever
//! listens while the call is out: the key's local line (`lease/outcome.rs`
//! decides from it whether a waiter that ran out in the line was behind
//! contention or in an outage, issue 68).
//!
//! Here, below the backends, so that they report without knowing the line:
//! a task-local set around the call by the core. Outside such a call
//! (renewals, releases, a backend used directly) a report goes nowhere.

use std::future::Future;
use std::sync::Arc;

/// Whoever listens to a backend call's reports.
pub(crate) trait Listener: Send + Sync {
    /// A request about the key was sent, bounded by the wait.
    fn sending(&self);
    /// The server answered about the key (held by another, granted).
    fn answered(&self);
}

tokio::task_local! {
    /// The listener of the backend call being polled.
    static LISTENER: Arc<dyn Listener>;
}

/// Runs `call` with `listener` hearing its reports.
pub(crate) async fn listened<F: Future>(listener: Arc<dyn Listener>, call: F) -> F::Output {
    LISTENER.scope(listener, call).await
}

/// A request about the call's key was sent, unanswered so far.
pub(crate) fn sending() {
    let _ = LISTENER.try_with(|l| l.sending());
}

/// The server answered about the call's key.
pub(crate) fn answered() {
    let _ = LISTENER.try_with(|l| l.answered());
}
