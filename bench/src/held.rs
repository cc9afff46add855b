//! `--held[=N]` (Redis): what keeping many leases alive costs the server.
//! N locks (default 50,000) held at ttl 3 s for a window of 10 s, and the
//! Redis CPU (`INFO cpu`) spent per renewal (`PEXPIRE`s the server ran,
//! from `INFO commandstats`), against a hand-written baseline on the same
//! server in the same run: the same N keys renewed by one compare-and-
//! `PEXPIRE` script call each every ttl/3, as dlock did before it renewed
//! up to 100 leases per call (and as single-key Redlock clients do).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockGuard};
use tokio::task::JoinSet;

use super::stats::{print_table, Row};
use super::workloads::BoxError;

/// The locks held when `--held` names no number.
pub const DEFAULT_HELD: usize = 50_000;
const TTL: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(10);

/// The baseline's renewal: one lease per call.
const RENEW_ONE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

/// The server's CPU time and the `PEXPIRE`s it ran so far.
async fn server_counters(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<(f64, u64), BoxError> {
    let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let seconds = |name: &str| {
        cpu.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let used = seconds("used_cpu_user:") + seconds("used_cpu_sys:");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let pexpires = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_pexpire:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0);
    Ok((used, pexpires))
}

/// Server CPU per renewal over `window`, while something renews.
async fn cpu_per_renewal(
    conn: &mut redis::aio::MultiplexedConnection,
    window: Duration,
) -> Result<(Duration, u64), BoxError> {
    let (cpu_before, renewals_before) = server_counters(conn).await?;
    tokio::time::sleep(window).await;
    let (cpu_after, renewals_after) = server_counters(conn).await?;
    let renewals = renewals_after.saturating_sub(renewals_before);
    let per = (cpu_after - cpu_before) / renewals.max(1) as f64;
    Ok((Duration::from_secs_f64(per.max(0.0)), renewals))
}

/// Runs the comparison against the server at `url` and prints the table.
pub async fn run(url: &str, held: usize) -> Result<(), BoxError> {
    let backend: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(url).await?);
    let client = redis::Client::open(url.split('?').next().unwrap_or(url))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let run_id = std::process::id();
    println!(
        "{held} locks held at ttl {TTL:?} against {}, {WINDOW:?} each",
        dlock::url::redact(url)
    );

    // dlock: N guards, renewed by the watchdog.
    let started = Instant::now();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(held);
    for batch in (0..held).collect::<Vec<_>>().chunks(1_000) {
        let mut taking = JoinSet::new();
        for &i in batch {
            let lock = Lock::new(format!("bench:{run_id}:held:{i}"))
                .with_backend(backend.clone())
                .ttl(TTL);
            taking.spawn(async move { lock.try_acquire().await });
        }
        while let Some(taken) = taking.join_next().await {
            guards.push(taken??.ok_or("a bench key was taken")?);
        }
    }
    let acquire_rate = held as f64 / started.elapsed().as_secs_f64();
    // The first renewals of the last guards, then the window.
    tokio::time::sleep(TTL / 3).await;
    let (ours, our_renewals) = cpu_per_renewal(&mut conn, WINDOW).await?;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    for guard in guards {
        // A lost lease's release says so; the count above has it.
        let _ = guard.release().await;
    }

    // The baseline: the same number of keys, one script call each per round.
    let script = redis::Script::new(RENEW_ONE);
    let keys: Vec<String> = (0..held)
        .map(|i| format!("bench:{run_id}:base:{i}"))
        .collect();
    for chunk in keys.chunks(1_000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("SET")
                .arg(key)
                .arg("token")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .ignore();
        }
        pipe.query_async::<()>(&mut conn).await?;
    }
    script.prepare_invoke().load_async(&mut conn).await?;
    let renewing = {
        let mut conn = conn.clone();
        let keys = keys.clone();
        let hash = script.get_hash().to_owned();
        tokio::spawn(async move {
            let stop = Instant::now() + WINDOW + TTL;
            while Instant::now() < stop {
                let round = Instant::now();
                for chunk in keys.chunks(1_000) {
                    let mut pipe = redis::pipe();
                    for key in chunk {
                        pipe.cmd("EVALSHA")
                            .arg(&hash)
                            .arg(1)
                            .arg(key)
                            .arg("token")
                            .arg(TTL.as_millis() as u64);
                    }
                    let _: Result<Vec<i64>, _> = pipe.query_async(&mut conn).await;
                }
                tokio::time::sleep_until((round + TTL / 3).into()).await;
            }
        })
    };
    tokio::time::sleep(TTL / 3).await;
    let (baseline, base_renewals) = cpu_per_renewal(&mut conn, WINDOW).await?;
    renewing.abort();
    for chunk in keys.chunks(1_000) {
        let _: i64 = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
    }

    println!(
        "dlock: acquired {acquire_rate:.0}/s, {our_renewals} renewals in the window, {lost} leases lost; baseline: {base_renewals} renewals"
    );
    print_table(
        &format!("Redis CPU per renewal, {held} held locks, ttl {TTL:?}"),
        "one script call per lease",
        &[Row::latency(
            &format!("Redis CPU per renewal, N = {held}"),
            ours,
            baseline,
        )],
    );
    Ok(())
}
