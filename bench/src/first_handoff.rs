//! `--first-handoff` (Redis): the hand-off after a 100 ms hold between two
//! dlock clients (each a backend of its own, the URL as given: by default
//! `foreign_share` 30 %), on 20 keys each handed on once (per-entity locks,
//! the first hand-off of each key) and on one key handed on 20 times. The
//! hand-off runs from just before the holder's release to the queued
//! waiter's grant. Target: p50 under 5 ms for both (issue 67; before, the
//! first hand-off of each key was a probe with a gap of 30/70 of the hold:
//! p50 about 50 ms).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend};

use super::stats::{fmt_duration, Summary};
use super::workloads::BoxError;

/// How long the holder holds before it hands the key on.
const HOLD: Duration = Duration::from_millis(100);
/// Hand-offs per row.
const HANDOFFS: usize = 20;

fn lock(key: &str, backend: &Arc<dyn LockBackend>) -> Lock {
    Lock::new(key)
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(10))
        .with_backend(backend.clone())
}

/// One hand-off of `key` from `from` to a waiter on `to`.
async fn hand_off(
    key: &str,
    from: &Arc<dyn LockBackend>,
    to: &Arc<dyn LockBackend>,
) -> Result<Duration, BoxError> {
    let held = lock(key, from).acquire().await?;
    let next = lock(key, to);
    let next = tokio::spawn(async move {
        let guard = next.acquire().await;
        (guard, Instant::now())
    });
    // The waiter queues meanwhile (its plain try, the subscription, its
    // queued try: a few ms).
    tokio::time::sleep(HOLD).await;
    let released = Instant::now();
    held.release().await?;
    let (guard, at) = next.await?;
    guard?.release().await?;
    Ok(at.saturating_duration_since(released))
}

/// Runs both rows against `url` and prints them.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let a = dlock::connect(url).await?;
    let b = dlock::connect(url).await?;
    let run_id = std::process::id();
    println!(
        "\n### First hand-off of a key ({}): two clients, {HOLD:?} holds, {HANDOFFS} hand-offs\n",
        dlock::url::redact(url)
    );
    println!("| keys | hand-off p50 | max | target p50 < 5 ms |");
    println!("|---|---:|---:|---|");
    let mut many = Vec::with_capacity(HANDOFFS);
    for i in 0..HANDOFFS {
        many.push(hand_off(&format!("bench:{run_id}:first:{i}"), &a, &b).await?);
    }
    let mut one = Vec::with_capacity(HANDOFFS);
    let key = format!("bench:{run_id}:first:one");
    for i in 0..HANDOFFS {
        // Handed back and forth: each hand-off within a second of the last.
        let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        one.push(hand_off(&key, from, to).await?);
    }
    for (what, samples) in [
        (format!("{HANDOFFS} keys, each handed on once"), &mut many),
        (format!("one key, handed on {HANDOFFS} times"), &mut one),
    ] {
        let max = samples.iter().max().copied().unwrap_or_default();
        let Some(summary) = Summary::of(samples) else {
            return Err("no hand-off measured".into());
        };
        println!(
            "| {what} | {} | {} | {} |",
            fmt_duration(summary.p50),
            fmt_duration(max),
            if summary.p50 < Duration::from_millis(5) {
                "met"
            } else {
                "MISSED"
            }
        );
    }
    Ok(())
}
