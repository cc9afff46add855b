//! Measuring a lease taken away behind its holder's back (issue 65): when
//! the holder's `lost()` fired, relative to another client's grant of the
//! same key, and that `ensure()` refuses from then on.

use std::future::Future;
use std::time::{Duration, Instant};

use dlock::LockGuard;
use tokio::task::JoinHandle;

/// Starts watching `guard`'s `lost()`: the handle answers when it fired.
pub fn watch_lost(guard: &LockGuard) -> JoinHandle<Instant> {
    let lost = guard.lost();
    tokio::spawn(async move {
        lost.await;
        Instant::now()
    })
}

/// Waits for `next` (another client's acquisition of the key that `guard`
/// held until it was taken away), then for the holder to hear the loss
/// (at most 10 s); asserts `ensure()` refuses, releases both and returns
/// when `lost()` fired in ms relative to the other grant (negative:
/// before it). `what` names the run in failure messages.
pub async fn lost_relative_to_next_grant<F>(
    guard: LockGuard,
    heard: JoinHandle<Instant>,
    next: F,
    what: &str,
) -> f64
where
    F: Future<Output = LockGuard>,
{
    let other = next.await;
    let granted = Instant::now();
    let heard_at = tokio::time::timeout(Duration::from_secs(10), heard)
        .await
        .unwrap_or_else(|_| panic!("{what}: the holder never heard the loss within 10 s"))
        .expect("the task watching lost()");
    assert!(
        guard.ensure().is_err(),
        "{what}: ensure() must refuse once lost() fired"
    );
    other.release().await.expect("the other client releases");
    drop(guard);
    if heard_at >= granted {
        heard_at.duration_since(granted).as_secs_f64() * 1000.0
    } else {
        -(granted.duration_since(heard_at).as_secs_f64() * 1000.0)
    }
}

/// Prints the worst of `figures` (ms after the other grant) under `label`
/// and asserts it loosely: the machines are noisy, the printed figure is
/// the measure (target: at most +100 ms).
pub fn report_worst(label: &str, figures: &[f64]) {
    let worst = figures.iter().cloned().fold(f64::MIN, f64::max);
    eprintln!(
        "{label}: worst {worst:+.1} ms over {} runs (target: <= +100 ms)",
        figures.len()
    );
    assert!(
        worst < 2000.0,
        "{label}: lost() came {worst:.1} ms after the other grant"
    );
}
