//! `--replicas`: what replica acknowledgement costs. The uncontended cycle
//! (one task, acquire + release) on a master with at least one replica,
//! with `?replicas=0` (no `WAIT`) against `?replicas=1` (a `WAIT 1` after
//! each grant), in alternating rounds of one run, and the same for 64 tasks
//! on distinct keys.

use std::sync::Arc;

use dlock::backends::redis::RedisBackend;
use dlock::LockBackend;

use super::stats::{print_table, Row};
use super::workloads::{alternating, distinct_dlock, uncontended_dlock, BoxError, Sizes};

const SIZES: Sizes = Sizes {
    uncontended_cycles: 2_000,
    distinct_tasks: 64,
    distinct_cycles: 200,
    hot_tasks: 0,
    hot_increments: 0,
    handoffs: 0,
};
/// Rounds of (b) per side, alternating.
const DISTINCT_ROUNDS: usize = 4;

/// `url` with one more query parameter.
fn with_param(url: &str, param: &str) -> String {
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}{param}")
}

/// Runs the comparison against the master at `url` (which must have a
/// replica connected) and prints the table.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let replicas = connected_replicas(url).await?;
    if replicas == 0 {
        return Err(format!(
            "{} has no replica connected: start one (redis-server --replicaof ...) to measure what acknowledgement costs",
            dlock::url::redact(url)
        )
        .into());
    }
    let off: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&with_param(url, "replicas=0")).await?);
    let on: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&with_param(url, "replicas=1")).await?);
    println!(
        "Replica acknowledgement against {} ({replicas} replica(s) connected)",
        dlock::url::redact(url)
    );
    let run_id = std::process::id();
    let (key_on, key_off) = (
        format!("bench:{run_id}:ack-on"),
        format!("bench:{run_id}:ack-off"),
    );
    let (on_ref, off_ref) = (&on, &off);
    let (acked, plain) = alternating(
        &SIZES,
        |n| Box::pin(uncontended_dlock(n, on_ref, &key_on)),
        |n| Box::pin(uncontended_dlock(n, off_ref, &key_off)),
    )
    .await?;
    let round = Sizes {
        distinct_cycles: SIZES.distinct_cycles / DISTINCT_ROUNDS,
        ..SIZES
    };
    let (mut acked_rate, mut plain_rate) = (0.0, 0.0);
    for i in 0..DISTINCT_ROUNDS {
        let (on_id, off_id) = (format!("{run_id}:on:{i}"), format!("{run_id}:off:{i}"));
        acked_rate += distinct_dlock(&round, &on, &on_id).await?;
        plain_rate += distinct_dlock(&round, &off, &off_id).await?;
    }
    let rows = [
        Row::latency("(a) 1 task, acquire+release, p50", acked.p50, plain.p50),
        Row::latency("(a) 1 task, acquire+release, p99", acked.p99, plain.p99),
        Row::throughput(
            "(b) 64 tasks, distinct keys",
            acked_rate / DISTINCT_ROUNDS as f64,
            plain_rate / DISTINCT_ROUNDS as f64,
        ),
    ];
    print_table(
        "replicas=1 (a WAIT after each grant) against replicas=0",
        "replicas=0",
        &rows,
    );
    Ok(())
}

/// The replicas connected to the master at `url` (`ROLE`).
async fn connected_replicas(url: &str) -> Result<usize, BoxError> {
    let base = url.split('?').next().unwrap_or(url);
    let client = redis::Client::open(base)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let role: redis::Value = redis::cmd("ROLE").query_async(&mut conn).await?;
    Ok(match role {
        redis::Value::Array(parts) => match parts.get(2) {
            Some(redis::Value::Array(replicas)) => replicas.len(),
            _ => 0,
        },
        _ => 0,
    })
}
