//! `--processes[=P,P,…]` (any backend): P processes taking turns on one key.
//!
//! Each "process" is a backend of its own (`dlock::connect`: its own
//! connections, subscriber and local queue, as a separate OS process has),
//! looping acquire → 1 ms → release on one key for a window. Printed per P
//! (default 1, 10 and 50): critical sections per second, the wait for the
//! lock (p50 / p99 / max, and p99 against the ideal FIFO wait: P − 1
//! critical sections of the measured mean length), per-process max / min
//! of critical sections (1.0 is perfectly even), the share of grants
//! served in arrival order (no acquisition that asked earlier was granted
//! later), and on Redis the server's commands (`INFO commandstats`, the
//! calls scripts make included), `EVALSHA`s and CPU per critical section;
//! on PostgreSQL the server's transactions per critical section
//! (`pg_stat_database`: each of dlock's statements is one). The P = 1 row
//! is the baseline the others are read against; on Redis, with P = 1 in the
//! list, each other P's server CPU per critical section is printed as a
//! multiple of it (`--processes=1,20`: the 20-process target, ≤ 2.0×;
//! `--runs=5` repeats the rounds and prints each run's ratio). `--hold-ms=N` makes each
//! critical section N ms instead of 1; the hand-off column (from a release
//! to the next grant, whichever process it goes to) then shows what the
//! queue adds between holders, e.g. the `?foreign_share=` gap.

use std::time::{Duration, Instant};

use dlock::Lock;

use super::redis_info::RedisInfo;
use super::stats::{fmt_duration, Summary};
use super::workloads::BoxError;

/// The P values when `--processes` names none.
pub const DEFAULT_PROCESSES: &[usize] = &[1, 10, 50];
const WINDOW: Duration = Duration::from_secs(10);
/// The critical section when `--hold-ms` names none.
pub const DEFAULT_HOLD: Duration = Duration::from_millis(1);

/// What one process did: when each acquisition asked and was granted, and
/// when it released.
struct Process {
    grants: Vec<(Instant, Instant)>,
    releases: Vec<Instant>,
}

/// From each release to the next grant (any process's), for the grants
/// and releases of a round: the time the lock stood free between holders.
fn hand_offs(mut held: Vec<(Instant, Instant)>) -> Vec<Duration> {
    held.sort_by_key(|&(granted, _)| granted);
    held.windows(2)
        .map(|pair| pair[1].0.saturating_duration_since(pair[0].1))
        .collect()
}

/// The share of grants served in arrival order: those for which every
/// acquisition that asked earlier had been granted before.
fn in_arrival_order(mut grants: Vec<(Instant, Instant)>) -> f64 {
    grants.sort_by_key(|&(_, granted)| granted);
    let mut earliest_later: Option<Instant> = None;
    let mut in_order = 0;
    for &(asked, _) in grants.iter().rev() {
        if earliest_later.is_none_or(|later| asked <= later) {
            in_order += 1;
        }
        earliest_later = Some(earliest_later.map_or(asked, |later| later.min(asked)));
    }
    in_order as f64 / grants.len().max(1) as f64
}

/// A PostgreSQL database's transactions so far (`pg_stat_database`).
async fn pg_transactions(client: &tokio_postgres::Client) -> Result<u64, BoxError> {
    // Backends report their counts at most once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let row = client
        .query_one(
            "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// A Redis server's counters: CPU seconds, commands, `EVALSHA`s.
#[derive(Clone, Copy, Default)]
struct ServerCounters {
    cpu: f64,
    commands: u64,
    evalshas: u64,
}

async fn redis_counters(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<ServerCounters, BoxError> {
    let info = RedisInfo::read(conn).await?;
    Ok(ServerCounters {
        cpu: info.cpu_seconds,
        commands: info.all_calls(),
        evalshas: info.calls("evalsha"),
    })
}

/// One round: `processes` backends on one key for [`WINDOW`].
async fn round(
    url: &str,
    key: &str,
    processes: usize,
    hold: Duration,
) -> Result<(Vec<Process>, Duration), BoxError> {
    let mut locks = Vec::with_capacity(processes);
    for _ in 0..processes {
        let backend = dlock::connect(url).await?;
        locks.push(
            Lock::new(key)
                .ttl(Duration::from_secs(10))
                .with_backend(backend),
        );
    }
    let started = Instant::now();
    let stop = started + WINDOW;
    let mut running = Vec::with_capacity(processes);
    for lock in locks {
        running.push(tokio::spawn(async move {
            let mut grants = Vec::new();
            let mut releases = Vec::new();
            while Instant::now() < stop {
                let asked = Instant::now();
                let guard = lock.acquire().await?;
                grants.push((asked, Instant::now()));
                tokio::time::sleep(hold).await;
                // Marked before the release's round trip: the key is free
                // from some moment within it.
                releases.push(Instant::now());
                guard.release().await?;
            }
            Ok::<_, dlock::LockError>(Process { grants, releases })
        }));
    }
    let mut done = Vec::with_capacity(processes);
    for process in running {
        done.push(process.await??);
    }
    Ok((done, started.elapsed()))
}

/// Runs the rounds against `url` `runs` times and prints a table per run,
/// then (on Redis, with P = 1 listed) each run's server CPU per critical
/// section at every other P as a multiple of P = 1's in the same run.
pub async fn run(url: &str, counts: &[usize], hold: Duration, runs: usize) -> Result<(), BoxError> {
    let mut ratios: Vec<Vec<(usize, f64)>> = Vec::with_capacity(runs);
    for run in 1..=runs {
        if runs > 1 {
            println!("\n## Run {run} of {runs}");
        }
        ratios.push(one_run(url, counts, hold).await?);
    }
    if runs > 1 {
        println!("\n### Server CPU per critical section against P = 1, each run\n");
        for (run, ratios) in ratios.iter().enumerate() {
            let each: Vec<String> = ratios
                .iter()
                .map(|(p, ratio)| format!("P = {p}: {ratio:.2}×"))
                .collect();
            println!("run {}: {}", run + 1, each.join(", "));
        }
    }
    Ok(())
}

/// One run: the rounds for each P, their table, and (Redis, P = 1 listed)
/// each other P's server CPU per critical section against P = 1.
async fn one_run(
    url: &str,
    counts: &[usize],
    hold: Duration,
) -> Result<Vec<(usize, f64)>, BoxError> {
    let mut stats_conn = if matches!(dlock::url::scheme(url), Some("redis" | "rediss")) {
        let plain = url.split('?').next().unwrap_or(url);
        Some(
            redis::Client::open(plain)?
                .get_multiplexed_async_connection()
                .await?,
        )
    } else {
        None
    };
    let pg_stats = if matches!(dlock::url::scheme(url), Some("postgres" | "postgresql")) {
        let (client, connection) = url
            .split('?')
            .next()
            .unwrap_or(url)
            .parse::<tokio_postgres::Config>()?
            .connect(tokio_postgres::NoTls)
            .await?;
        tokio::spawn(connection);
        Some(client)
    } else {
        None
    };
    println!(
        "\n### P processes on one key ({}), acquire → {hold:?} → release for {WINDOW:?}\n",
        dlock::url::redact(url)
    );
    println!("| P | critical sections/s | wait p50 / p99 / max | p99 vs ideal FIFO | hand-off p50 / p99 | per-process max / min | in arrival order | server commands (PostgreSQL: transactions) per CS | `EVALSHA` per CS | server CPU per CS |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let run_id = std::process::id();
    // Server CPU per critical section at each P (Redis), for the ratios.
    let mut cpu_per_section: Vec<(usize, f64)> = Vec::new();
    for &p in counts {
        let key = format!("bench:{run_id}:processes:{p}");
        let before = match stats_conn.as_mut() {
            Some(conn) => Some(redis_counters(conn).await?),
            None => None,
        };
        let pg_before = match pg_stats.as_ref() {
            Some(client) => Some(pg_transactions(client).await?),
            None => None,
        };
        let (processes, took) = round(url, &key, p, hold).await?;
        let after = match stats_conn.as_mut() {
            Some(conn) => Some(redis_counters(conn).await?),
            None => None,
        };
        let pg_after = match pg_stats.as_ref() {
            Some(client) => Some(pg_transactions(client).await?),
            None => None,
        };
        let counts: Vec<usize> = processes.iter().map(|p| p.grants.len()).collect();
        let sections: usize = counts.iter().sum();
        let held: Vec<(Instant, Instant)> = processes
            .iter()
            .flat_map(|p| {
                p.grants
                    .iter()
                    .map(|&(_, g)| g)
                    .zip(p.releases.iter().copied())
            })
            .collect();
        let mut gaps = hand_offs(held);
        let hand_off = match Summary::of(&mut gaps) {
            Some(gaps) if p > 1 => {
                format!("{} / {}", fmt_duration(gaps.p50), fmt_duration(gaps.p99))
            }
            _ => "–".to_owned(),
        };
        let grants: Vec<(Instant, Instant)> =
            processes.into_iter().flat_map(|p| p.grants).collect();
        let mut waits: Vec<Duration> = grants.iter().map(|&(a, g)| g - a).collect();
        let ordered = in_arrival_order(grants);
        let max_wait = waits.iter().max().copied().unwrap_or_default();
        let Some(summary) = Summary::of(&mut waits) else {
            return Err(format!("no critical section at P = {p}").into());
        };
        let per_second = sections as f64 / took.as_secs_f64();
        // Ideal FIFO: each waiter waits for the P − 1 others' sections.
        let mean_section = took / sections.max(1) as u32;
        let ideal = mean_section * (p.saturating_sub(1) as u32).max(1);
        let spread = match (counts.iter().max(), counts.iter().min()) {
            (Some(&max), Some(&min)) if p > 1 => {
                format!("{max} / {min} = {:.2}", max as f64 / min.max(1) as f64)
            }
            _ => "–".to_owned(),
        };
        if let (Some(b), Some(a)) = (before, after) {
            cpu_per_section.push((p, (a.cpu - b.cpu).max(0.0) / sections.max(1) as f64));
        }
        let server = match (before, after) {
            (Some(b), Some(a)) => {
                let per = |n: u64| n as f64 / sections.max(1) as f64;
                (
                    format!("{:.1}", per(a.commands - b.commands)),
                    format!("{:.1}", per(a.evalshas - b.evalshas)),
                    fmt_duration(Duration::from_secs_f64(
                        ((a.cpu - b.cpu) / sections.max(1) as f64).max(0.0),
                    )),
                )
            }
            _ => match (pg_before, pg_after) {
                // Less the two reads of the counters themselves.
                (Some(b), Some(a)) => (
                    format!(
                        "{:.1}",
                        a.saturating_sub(b + 2) as f64 / sections.max(1) as f64
                    ),
                    "–".to_owned(),
                    "–".to_owned(),
                ),
                _ => ("–".to_owned(), "–".to_owned(), "–".to_owned()),
            },
        };
        println!(
            "| {p} | {per_second:.0} | {} / {} / {} | {:.2}× | {hand_off} | {spread} | {:.1} % | {} | {} | {} |",
            fmt_duration(summary.p50),
            fmt_duration(summary.p99),
            fmt_duration(max_wait),
            summary.p99.as_secs_f64() / ideal.as_secs_f64(),
            ordered * 100.0,
            server.0,
            server.1,
            server.2,
        );
    }
    // The target of issue 67: at P = 20, at most 2.0× the server CPU per
    // critical section of one process alone.
    let mut ratios = Vec::new();
    if let Some(&(_, alone)) = cpu_per_section.iter().find(|(p, _)| *p == 1) {
        for &(p, cpu) in cpu_per_section.iter().filter(|(p, _)| *p > 1) {
            let ratio = cpu / alone.max(f64::MIN_POSITIVE);
            println!("\nserver CPU per critical section at P = {p}: {ratio:.2}× one process alone");
            ratios.push((p, ratio));
        }
    }
    Ok(ratios)
}

/// The critical section of `--hold-ms=N` (N from 1 to 10,000).
pub fn parse_hold(arg: &str) -> Option<Duration> {
    arg.parse()
        .ok()
        .filter(|ms: &u64| (1..=10_000).contains(ms))
        .map(Duration::from_millis)
}

/// The number of runs of `--runs=N` (1 to 20).
pub fn parse_runs(arg: &str) -> Option<usize> {
    arg.parse().ok().filter(|n: &usize| (1..=20).contains(n))
}

/// The P values of `--processes[=P,P,…]`.
pub fn parse_counts(arg: &str) -> Option<Vec<usize>> {
    match arg {
        "" => Some(DEFAULT_PROCESSES.to_vec()),
        list => list
            .strip_prefix('=')?
            .split(',')
            .map(|n| n.trim().parse().ok().filter(|&n: &usize| n > 0))
            .collect(),
    }
}
