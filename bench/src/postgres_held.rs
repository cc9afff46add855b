//! `--held[=N,…]` on a `postgres://` URL: what holding many advisory locks
//! costs, and what a full lock table does.
//!
//! For each N (default 1,000, 10,000 and 20,000), on a fresh backend:
//!
//! 1. **Renewal rounds**: N leases taken through the backend's own API
//!    (`LockBackend::try_acquire`, at most `--in-flight` at once, ttl
//!    30 s), then five `renew` calls of all of them, one after another:
//!    the median is the renewal round at N.
//! 2. **Held for three ttls**: N locks taken as guards (ttl 3 s, renewed
//!    by the watchdog), held three ttls, then counted: granted, refused
//!    (and whether every refusal names `max_locks_per_transaction`), and
//!    lost (no longer held at the end).
//!
//! The server's lock table bounds N: with the default settings
//! (`max_locks_per_transaction` 64, `max_connections` 100) about 11,900
//! advisory locks fit, so N = 20,000 shows the refusals.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Lease};
use dlock::{Lock, LockBackend, LockGuard};
use tokio::task::JoinSet;

use super::stats::fmt_duration;
use super::workloads::BoxError;

/// The N values when `--held` names none.
pub const DEFAULT_HELD: &[usize] = &[1_000, 10_000, 20_000];
const TTL: Duration = Duration::from_secs(3);
const RAW_TTL: Duration = Duration::from_secs(30);
const ROUNDS: usize = 5;

/// One N's figures.
struct Measured {
    asked: usize,
    granted: usize,
    refused: usize,
    refusals_named: bool,
    lost: usize,
    round: Duration,
    raw_held: usize,
}

/// Runs `--held` against a `postgres://` URL and prints the table.
pub async fn run(url: &str, counts: &[usize], in_flight: usize) -> Result<(), BoxError> {
    println!(
        "\n### Held locks ({}), ttl {TTL:?} held three ttls; renewal round: median of {ROUNDS} `renew` calls of every lease\n",
        dlock::url::redact(url),
    );
    let mut rows = Vec::new();
    for &n in counts {
        let (round, raw_held) = renewal_round(url, n, in_flight).await?;
        let row = hold(url, n, in_flight, round, raw_held).await?;
        eprintln!(
            "N = {n}: {} granted, {} refused, {} lost, renewal round {:?} at {raw_held}",
            row.granted, row.refused, row.lost, row.round
        );
        rows.push(row);
    }
    println!("| locks asked | granted | refused | every refusal names `max_locks_per_transaction` | leases lost over three ttls | renewal round (leases renewed) | per lease |");
    println!("|---:|---:|---:|---|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} ({}) | {} |",
            r.asked,
            r.granted,
            r.refused,
            if r.refused == 0 {
                "–"
            } else if r.refusals_named {
                "yes"
            } else {
                "**no**"
            },
            r.lost,
            fmt_duration(r.round),
            r.raw_held,
            fmt_duration(r.round / r.raw_held.max(1) as u32),
        );
    }
    Ok(())
}

/// Takes up to `n` leases through the backend's API and times renewal
/// rounds of all of them; the median and how many were held.
async fn renewal_round(
    url: &str,
    n: usize,
    in_flight: usize,
) -> Result<(Duration, usize), BoxError> {
    let backend: Arc<dyn LockBackend> = dlock::connect(url).await?;
    let run_id = std::process::id();
    let mut leases: Vec<Lease> = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(in_flight.max(1)) {
        let mut taking = JoinSet::new();
        for &i in chunk {
            let backend = backend.clone();
            let req = AcquireRequest {
                key: format!("bench:{run_id}:raw:{n}:{i}"),
                token: format!("{run_id:016x}{i:016x}{n:016x}"),
                ttl: RAW_TTL,
            };
            taking.spawn(async move { backend.try_acquire(&req).await });
        }
        while let Some(taken) = taking.join_next().await {
            // A refusal (a full lock table) is counted in the guards' part.
            if let Ok(Some(lease)) = taken? {
                leases.push(lease);
            }
        }
    }
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let answers = backend.renew(&leases).await;
        times.push(started.elapsed());
        let failed = answers.iter().filter(|a| a.is_err()).count();
        if failed > 0 {
            eprintln!("N = {n}: {failed} renewals failed in a round");
        }
    }
    times.sort();
    for lease in &leases {
        let _ = backend.release(lease).await;
    }
    Ok((times[ROUNDS / 2], leases.len()))
}

/// Takes `n` locks as guards, holds them three ttls, counts.
async fn hold(
    url: &str,
    n: usize,
    in_flight: usize,
    round: Duration,
    raw_held: usize,
) -> Result<Measured, BoxError> {
    let backend: Arc<dyn LockBackend> = dlock::connect(url).await?;
    let run_id = std::process::id();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(n);
    let (mut refused, mut named) = (0, true);
    for chunk in (0..n).collect::<Vec<_>>().chunks(in_flight.max(1)) {
        let mut taking = JoinSet::new();
        for &i in chunk {
            let lock = Lock::new(format!("bench:{run_id}:held:{n}:{i}"))
                .with_backend(backend.clone())
                .ttl(TTL);
            taking.spawn(async move { lock.try_acquire().await });
        }
        while let Some(taken) = taking.join_next().await {
            match taken? {
                Ok(Some(guard)) => guards.push(guard),
                Ok(None) => return Err(format!("N = {n}: a bench key was busy").into()),
                Err(e) => {
                    refused += 1;
                    named &= e.to_string().contains("max_locks_per_transaction");
                }
            }
        }
    }
    tokio::time::sleep(TTL * 3).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    let granted = guards.len();
    for guard in guards {
        let _ = guard.release().await;
    }
    Ok(Measured {
        asked: n,
        granted,
        refused,
        refusals_named: named,
        lost,
        round,
        raw_held,
    })
}
