//! Redlock: dlock's Redlock backend against the `rslock` crate (the Rust
//! Redlock peer) on the same masters in the same run, on all the masters the
//! URL names and, when it names five, on the first three as well.
//!
//! The workloads are those of the Redis suite: one task's acquire+release
//! latency, 64 tasks on distinct keys, 16 tasks on one key with a checked
//! counter, and hand-off latency from a release to the next holder (in
//! another client). rslock waits by retrying after a random delay up to its
//! default 200 ms; dlock wakes waiters by pub/sub on every master.

use std::sync::Arc;
use std::time::Duration;

use super::allocations;
use super::observed::cpu_time;
use super::rslock::{self, RsLock};
use super::stats::{print_table, Row};
use super::workloads::{
    alternating, distinct_dlock, handoff_dlock, handoff_rows, hot_key, hot_key_dlock, hot_key_rows,
    uncontended_dlock, BoxError, Sizes,
};
use dlock::backends::redlock::RedlockBackend;
use dlock::LockBackend;

/// The workload sizes of this suite.
const SIZES: Sizes = Sizes {
    uncontended_cycles: 1_000,
    distinct_tasks: 64,
    distinct_cycles: 200,
    hot_tasks: 16,
    hot_increments: 100,
    handoffs: 100,
};
/// Upper bound for one workload, so a broken run ends instead of hanging.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(300);

/// Runs the workloads against the masters of `url` (`redlock://h:p,h:p,h:p`)
/// and, if it names five, against its first three too; prints a table each.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let hosts = hosts(url)?;
    println!(
        "Redlock benchmark against {} masters: {}",
        hosts.len(),
        dlock::url::redact(url)
    );
    let mut sets = vec![hosts.clone()];
    if hosts.len() == 5 {
        sets.push(hosts[..3].to_vec());
    }
    for set in sets {
        run_set(&set).await?;
    }
    Ok(())
}

/// The `host:port` list of a `redlock://` URL (parameters dropped).
fn hosts(url: &str) -> Result<Vec<String>, BoxError> {
    let rest = url
        .strip_prefix("redlock://")
        .ok_or("give a redlock://host:port,host:port,host:port URL")?;
    let before_query = rest.split('?').next().unwrap_or(rest);
    let hosts: Vec<String> = before_query
        .trim_end_matches('/')
        .split(',')
        .map(str::to_owned)
        .collect();
    if hosts.len() < 3 || hosts.iter().any(String::is_empty) {
        return Err(format!("`{url}` must name at least three masters").into());
    }
    Ok(hosts)
}

async fn with_limit<T>(
    what: &str,
    work: impl std::future::Future<Output = Result<T, BoxError>>,
) -> Result<T, BoxError> {
    tokio::time::timeout(WORKLOAD_LIMIT, work)
        .await
        .map_err(|_| format!("{what} did not finish within {WORKLOAD_LIMIT:?}"))?
}

/// (b)'s cycles per second, with this process's CPU time and heap
/// allocations per cycle (every thread) while it ran.
async fn client_cost(
    work: impl std::future::Future<Output = Result<f64, BoxError>>,
) -> Result<(f64, std::time::Duration, f64), BoxError> {
    let cycles = (SIZES.distinct_tasks * SIZES.distinct_cycles) as f64;
    let (cpu, allocated) = (cpu_time(), allocations::count());
    let rate = work.await?;
    let allocs = allocations::per_cycle(allocated, allocations::count(), cycles);
    let cpu = cpu
        .zip(cpu_time())
        .map_or(std::time::Duration::ZERO, |(b, a)| {
            a.saturating_sub(b).div_f64(cycles)
        });
    Ok((rate, cpu, allocs))
}

async fn run_set(hosts: &[String]) -> Result<(), BoxError> {
    let n = hosts.len();
    let url = format!("redlock://{}", hosts.join(","));
    let node_urls: Vec<String> = hosts.iter().map(|h| format!("redis://{h}")).collect();
    let backend: Arc<dyn LockBackend> = Arc::new(RedlockBackend::connect(&url).await?);
    let rs = rslock::manager(&node_urls)?;
    let run_id = format!("{}:{n}", std::process::id());

    let (key, rs_key) = (format!("bench:{run_id}:a"), format!("bench:{run_id}:a-rs"));
    let (backend_ref, rs_ref) = (&backend, &rs);
    let (ours_a, base_a) = alternating(
        &SIZES,
        |n| {
            Box::pin(with_limit(
                "(a) dlock",
                uncontended_dlock(n, backend_ref, &key),
            ))
        },
        |n| {
            Box::pin(with_limit(
                "(a) rslock",
                rslock::uncontended(rs_ref, n, &rs_key),
            ))
        },
    )
    .await?;

    let ours_b = client_cost(with_limit(
        "(b) dlock",
        distinct_dlock(&SIZES, &backend, &run_id),
    ))
    .await?;
    let base_b = client_cost(with_limit(
        "(b) rslock",
        rslock::distinct(&SIZES, &rs, &format!("bench:{run_id}:b-rs")),
    ))
    .await?;

    let ours_c = with_limit(
        "(c) dlock",
        hot_key_dlock(&SIZES, &backend, &format!("bench:{run_id}:c")),
    )
    .await?;
    let base_c = with_limit(
        "(c) rslock",
        hot_key(&SIZES, RsLock::new(&rs, &format!("bench:{run_id}:c-rs"))),
    )
    .await?;

    // Hand-off crosses clients, as between two processes: the waiter has its own connections.
    let waiter: Arc<dyn LockBackend> = Arc::new(RedlockBackend::connect(&url).await?);
    let ours_d = with_limit(
        "(d) dlock",
        handoff_dlock(&SIZES, &backend, &waiter, &format!("bench:{run_id}:d")),
    )
    .await?;
    let base_d = with_limit(
        "(d) rslock",
        rslock::handoff(
            &SIZES,
            &rs,
            &rslock::manager(&node_urls)?,
            &format!("bench:{run_id}:d-rs"),
        ),
    )
    .await?;

    let mut rows = vec![
        Row::latency("(a) 1 task, acquire+release, p50", ours_a.p50, base_a.p50),
        Row::latency("(a) 1 task, acquire+release, p99", ours_a.p99, base_a.p99),
        Row::throughput("(b) 64 tasks, distinct keys, cycles", ours_b.0, base_b.0),
        Row::latency(
            "(b) client CPU per cycle (this process)",
            ours_b.1,
            base_b.1,
        ),
        Row::per_op(
            "(b) allocations per cycle (this process)",
            ours_b.2,
            base_b.2,
        ),
    ];
    rows.extend(hot_key_rows(&ours_c, &base_c));
    rows.extend(handoff_rows(&ours_d, &base_d));
    print_table(
        &format!("Redlock on {n} masters: dlock vs rslock 0.10"),
        "rslock",
        &rows,
    );
    println!("\n{}", SIZES.describe());
    Ok(())
}
