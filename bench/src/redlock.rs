//! Redlock: dlock's Redlock backend against the `rslock` crate (the Rust
//! Redlock peer) on the same masters in the same run, on all the masters the
//! URL names and, when it names five, on the first three as well.
//!
//! The workloads are those of the Redis suite: one task's acquire+release
//! latency, 64 tasks on distinct keys, 16 tasks on one key with a checked
//! counter, and hand-off latency from a release to the next holder (in
//! another client). rslock waits by retrying after a random delay up to its
//! default 200 ms; dlock wakes waiters by pub/sub on every master.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redlock::RedlockBackend;
use dlock::LockBackend;
use rslock::LockManager;

use super::stats::{print_table, Row, Summary};
use super::workloads::{
    alternating, check_counter, critical_increment, distinct_dlock, handoff_dlock, hot_key_dlock,
    uncontended_dlock, BoxError, Sizes, TTL,
};

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
pub async fn run(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    run_inner(url)
        .await
        .map_err(|e| e as Box<dyn std::error::Error>)
}

async fn run_inner(url: &str) -> Result<(), BoxError> {
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

/// `LockManager::new` panics on a bad URL; open the clients ourselves.
fn rslock_manager(node_urls: &[String]) -> Result<LockManager, BoxError> {
    let clients = node_urls
        .iter()
        .map(|u| redis::Client::open(u.as_str()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LockManager::from_clients(clients))
}

async fn with_limit<T>(
    what: &str,
    work: impl std::future::Future<Output = Result<T, BoxError>>,
) -> Result<T, BoxError> {
    tokio::time::timeout(WORKLOAD_LIMIT, work)
        .await
        .map_err(|_| format!("{what} did not finish within {WORKLOAD_LIMIT:?}"))?
}

async fn run_set(hosts: &[String]) -> Result<(), BoxError> {
    let n = hosts.len();
    let url = format!("redlock://{}", hosts.join(","));
    let node_urls: Vec<String> = hosts.iter().map(|h| format!("redis://{h}")).collect();
    let backend: Arc<dyn LockBackend> = Arc::new(RedlockBackend::connect(&url).await?);
    let rs = rslock_manager(&node_urls)?;
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
                uncontended_rslock(rs_ref, n, &rs_key),
            ))
        },
    )
    .await?;

    let ours_b = with_limit("(b) dlock", distinct_dlock(&SIZES, &backend, &run_id)).await?;
    let base_b = with_limit("(b) rslock", distinct_rslock(&rs, &run_id)).await?;

    let ours_c = with_limit(
        "(c) dlock",
        hot_key_dlock(&SIZES, &backend, &format!("bench:{run_id}:c")),
    )
    .await?;
    let base_c = with_limit(
        "(c) rslock",
        hot_key_rslock(&rs, &format!("bench:{run_id}:c-rs")),
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
        handoff_rslock(
            &rs,
            &rslock_manager(&node_urls)?,
            &format!("bench:{run_id}:d-rs"),
        ),
    )
    .await?;

    let rows = [
        Row::latency("(a) 1 task, acquire+release, p50", ours_a.p50, base_a.p50),
        Row::latency("(a) 1 task, acquire+release, p99", ours_a.p99, base_a.p99),
        Row::throughput("(b) 64 tasks, distinct keys, cycles", ours_b, base_b),
        Row::throughput("(c) 16 tasks, one key, critical sections", ours_c, base_c),
        Row::latency(
            "(d) hand-off release→next holder, p50",
            ours_d.p50,
            base_d.p50,
        ),
        Row::latency(
            "(d) hand-off release→next holder, p99",
            ours_d.p99,
            base_d.p99,
        ),
    ];
    print_table(
        &format!("Redlock on {n} masters: dlock vs rslock 0.10"),
        "rslock",
        &rows,
    );
    println!("\n{}", SIZES.describe());
    Ok(())
}

async fn uncontended_rslock(
    rs: &LockManager,
    cycles: usize,
    key: &str,
) -> Result<Vec<Duration>, BoxError> {
    let mut samples = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        let start = Instant::now();
        let lock = rs.lock(key.as_bytes(), TTL).await?;
        rs.unlock(&lock).await;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

async fn distinct_rslock(rs: &LockManager, run_id: &str) -> Result<f64, BoxError> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..SIZES.distinct_tasks {
        let (rs, key) = (rs.clone(), format!("bench:{run_id}:b-rs:{t}"));
        tasks.push(tokio::spawn(async move {
            for _ in 0..SIZES.distinct_cycles {
                let lock = rs.lock(key.as_bytes(), TTL).await?;
                rs.unlock(&lock).await;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((SIZES.distinct_tasks * SIZES.distinct_cycles) as f64 / start.elapsed().as_secs_f64())
}

async fn hot_key_rslock(rs: &LockManager, key: &str) -> Result<f64, BoxError> {
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..SIZES.hot_tasks {
        let (rs, key, counter) = (rs.clone(), key.to_owned(), counter.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..SIZES.hot_increments {
                // `acquire` retries until it gets the lock.
                let guard = rs.acquire(key.as_bytes(), TTL).await?;
                critical_increment(&counter).await;
                guard.release().await;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = start.elapsed();
    check_counter(&counter, SIZES.hot_tasks as u64 * SIZES.hot_increments)?;
    Ok(counter.load(Ordering::SeqCst) as f64 / elapsed.as_secs_f64())
}

async fn handoff_rslock(
    holder: &LockManager,
    waiter: &LockManager,
    key: &str,
) -> Result<Summary, BoxError> {
    let mut samples = Vec::with_capacity(SIZES.handoffs);
    for _ in 0..SIZES.handoffs {
        let lock = holder.acquire_no_guard(key.as_bytes(), TTL).await?;
        let (waiter, key2) = (waiter.clone(), key.to_owned());
        let waiting = tokio::spawn(async move {
            let lock = waiter.acquire_no_guard(key2.as_bytes(), TTL).await?;
            let got = Instant::now();
            waiter.unlock(&lock).await;
            Ok::<_, BoxError>(got)
        });
        tokio::time::sleep(Duration::from_millis(3)).await;
        let released = Instant::now();
        holder.unlock(&lock).await;
        samples.push(waiting.await??.saturating_duration_since(released));
    }
    Summary::of(&mut samples).ok_or_else(|| "no samples".into())
}
