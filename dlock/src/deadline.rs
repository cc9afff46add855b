//! Bounding a wait by an optional deadline.

use std::future::Future;
use std::time::Instant;

/// Runs `work` until `deadline` (`None`: no limit). `None` if the deadline
/// came first; `work` is dropped then, so it must be cancel safe.
pub(crate) async fn until<T>(
    deadline: Option<Instant>,
    work: impl Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), work).await.ok(),
        None => Some(work.await),
    }
}
