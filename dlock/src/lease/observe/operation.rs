//! What an operator's call tells operators: the `dlock.operation` span and
//! the `dlock_operations_total` counter (names in
//! `crate::guide::observability`). Here, below `locks` and `inspect`, because
//! both run operations: `Lock::inspect` and `list_locks` above, and
//! `Semaphore::available` and `BarrierMember::leave` below them.

use tracing::Instrument;

use crate::LockError;

/// Runs one operator operation in its `dlock.<name>` span and counts it
/// (`dlock_operations_total{backend, op, outcome}`).
pub(crate) async fn operation<T>(
    name: &'static str,
    key: &str,
    backend: &str,
    work: impl std::future::Future<Output = Result<T, LockError>>,
    outcome: impl Fn(&T) -> &'static str,
) -> Result<T, LockError> {
    let span = tracing::debug_span!(
        "dlock.operation",
        op = name,
        key = %key,
        backend,
        outcome = tracing::field::Empty
    );
    let result = work.instrument(span.clone()).await;
    let out = match &result {
        Ok(v) => outcome(v),
        Err(_) => "error",
    };
    span.record("outcome", out);
    count(name, backend, out);
    result
}

#[cfg(feature = "metrics")]
pub(crate) fn count(op: &'static str, backend: &str, outcome: &'static str) {
    metrics::counter!("dlock_operations_total", "backend" => backend.to_owned(), "op" => op, "outcome" => outcome)
        .increment(1);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn count(_: &'static str, _: &str, _: &'static str) {}
