//! Waiting, bounded, for a condition a test cannot be told about: polled
//! every 20 ms, failing the test when it does not hold in time.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 20 ms until it holds, for at most `limit`; panics
/// naming `what` if it never does.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls the blocking `check` (e.g. a SQL client run) every 50 ms until it
/// holds, for at most `limit`; panics naming `what` if it never does.
pub async fn eventually_blocking(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what} not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
