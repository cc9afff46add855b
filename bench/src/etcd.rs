//! etcd: dlock's [`EtcdBackend`] against a raw `etcd_client::LockClient`
//! lock/unlock loop on the same cluster in the same run.
//!
//! The raw loop is what a hand-written etcd lock costs: one lease granted up
//! front, then `Lock` and `Unlock` RPCs (etcd's server-side v3lock service,
//! which runs Go's `concurrency.Mutex` inside the server). dlock does the
//! same work from the client: one transaction to enqueue and read the holder,
//! one to delete.
//!
//! Workloads:
//! - uncontended acquire+release cycle latency (p50, p99), one client;
//! - contended throughput: 8 clients (each its own connection and lease)
//!   cycling on one key for a fixed time;
//! - hand-off: a waiter is queued behind a holder; the time from the
//!   holder's release call to the waiter holding the lock (p50, p99).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::etcd::EtcdBackend;
use dlock::{Lock, LockBackend};
use etcd_client::{Client, LockOptions};

use super::stats::{print_table, Row, Summary};

use super::workloads::{handoffs, BoxError};

const WARMUP: usize = 20;
/// Uncontended cycles per side, run in alternating rounds so that drift of
/// the machine (other builds, disk flushes) hits both sides alike.
const ROUNDS: usize = 4;
const CYCLES_PER_ROUND: usize = 100;
const CONTENDERS: usize = 8;
const CONTENDED_FOR: Duration = Duration::from_secs(4);
const HANDOFFS: usize = 60;
/// How long the waiter is given to queue before the holder lets go.
const QUEUE_SETTLE: Duration = Duration::from_millis(30);
/// Lease length on both sides: long enough that no renewal runs in a cycle.
const TTL: Duration = Duration::from_secs(30);

/// Runs the etcd suite against `url` (`etcd://host:port[,host:port...]`).
///
/// # Errors
/// If the URL is not a plain `etcd://` URL or the cluster fails.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let endpoints = endpoints(url)?;
    println!("etcd bench against {}", dlock::url::redact(url));

    let (ours_cycle, raw_cycle) = uncontended(url, &endpoints).await?;
    let ours_tput = contended_ours(url).await?;
    let raw_tput = contended_raw(&endpoints).await?;
    let ours_handoff = handoff_ours(url).await?;
    let raw_handoff = handoff_raw(&endpoints).await?;

    let rows = [
        Row::latency(
            "uncontended acquire+release, p50",
            ours_cycle.p50,
            raw_cycle.p50,
        ),
        Row::latency(
            "uncontended acquire+release, p99",
            ours_cycle.p99,
            raw_cycle.p99,
        ),
        Row::throughput(
            &format!("contended cycles, {CONTENDERS} clients, one key"),
            ours_tput,
            raw_tput,
        ),
        Row::latency("hand-off by watch, p50", ours_handoff.p50, raw_handoff.p50),
        Row::latency("hand-off by watch, p99", ours_handoff.p99, raw_handoff.p99),
    ];
    print_table("etcd", "raw etcd-client LockClient", &rows);
    println!();
    let slower = raw_cycle.p50.as_secs_f64() / ours_cycle.p50.as_secs_f64();
    println!(
        "target: uncontended p50 within 10 % of the raw loop: {} (dlock at {:.2}× the raw speed)",
        if slower >= 0.9 { "met" } else { "NOT met" },
        slower
    );
    println!(
        "target: hand-off p50 under 5 ms: {} ({:?})",
        if ours_handoff.p50 < Duration::from_millis(5) {
            "met"
        } else {
            "NOT met"
        },
        ours_handoff.p50
    );
    Ok(())
}

/// `host:port` endpoints of a plain `etcd://` URL, for the raw client.
fn endpoints(url: &str) -> Result<Vec<String>, BoxError> {
    let Some(rest) = url.strip_prefix("etcd://") else {
        return Err("the etcd bench takes a plain etcd://host:port[,host:port...] URL".into());
    };
    let hosts = rest.split(['/', '?']).next().unwrap_or_default();
    if hosts.is_empty() || hosts.contains('@') {
        return Err(
            "the etcd bench takes etcd://host:port[,host:port...] without credentials".into(),
        );
    }
    Ok(hosts.split(',').map(str::to_owned).collect())
}

async fn ours(url: &str) -> Result<Arc<dyn LockBackend>, BoxError> {
    Ok(Arc::new(EtcdBackend::connect(url).await?))
}

/// A raw client and a lease of its own, as a hand-written etcd lock holds.
async fn raw(endpoints: &[String]) -> Result<(Client, i64), BoxError> {
    let mut client = Client::connect(endpoints, None).await?;
    let lease = client.lease_grant(TTL.as_secs() as i64, None).await?.id();
    Ok((client, lease))
}

fn unique(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench:{what}:{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The raw name of dlock's key `key` (default prefix), so both sides use
/// keys of the same shape.
fn raw_name(key: &str) -> String {
    format!("dlock/{key}")
}

async fn uncontended(url: &str, endpoints: &[String]) -> Result<(Summary, Summary), BoxError> {
    let backend = ours(url).await?;
    let (mut client, lease) = raw(endpoints).await?;
    let lock = Lock::new(unique("cycle")).with_backend(backend).ttl(TTL);
    let name = raw_name(&unique("raw-cycle"));
    let mut ours_samples = Vec::new();
    let mut raw_samples = Vec::new();
    for round in 0..=ROUNDS {
        // Round 0 warms both sides up and is not counted.
        let count = if round == 0 { WARMUP } else { CYCLES_PER_ROUND };
        for _ in 0..count {
            let started = Instant::now();
            lock.acquire().await?.release().await?;
            if round > 0 {
                ours_samples.push(started.elapsed());
            }
        }
        for _ in 0..count {
            let started = Instant::now();
            let held = client
                .lock(name.as_str(), Some(LockOptions::new().with_lease(lease)))
                .await?;
            client.unlock(held.key()).await?;
            if round > 0 {
                raw_samples.push(started.elapsed());
            }
        }
    }
    client.lease_revoke(lease).await?;
    let ours = Summary::of(&mut ours_samples).ok_or("no samples")?;
    let raw = Summary::of(&mut raw_samples).ok_or("no samples")?;
    Ok((ours, raw))
}

async fn contended_ours(url: &str) -> Result<f64, BoxError> {
    let key = unique("contended");
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_millis(500) + CONTENDED_FOR;
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let lock = Lock::new(key.as_str())
            .with_backend(ours(url).await?)
            .ttl(TTL)
            .wait(Duration::from_secs(30));
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                lock.acquire().await?.release().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, dlock::LockError>(())
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

async fn contended_raw(endpoints: &[String]) -> Result<f64, BoxError> {
    let name = raw_name(&unique("raw-contended"));
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_millis(500) + CONTENDED_FOR;
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let (mut client, lease) = raw(endpoints).await?;
        let (name, done) = (name.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let held = client
                    .lock(name.as_str(), Some(LockOptions::new().with_lease(lease)))
                    .await?;
                client.unlock(held.key()).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            client.lease_revoke(lease).await?;
            Ok::<_, etcd_client::Error>(())
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

async fn handoff_ours(url: &str) -> Result<Summary, BoxError> {
    let key = unique("handoff");
    let holder = Lock::new(key.as_str())
        .with_backend(ours(url).await?)
        .ttl(TTL);
    let waiter = Lock::new(key.as_str())
        .with_backend(ours(url).await?)
        .ttl(TTL)
        .wait(Duration::from_secs(10));
    handoffs(&holder, &waiter, WARMUP / 4, HANDOFFS, QUEUE_SETTLE).await
}

async fn handoff_raw(endpoints: &[String]) -> Result<Summary, BoxError> {
    let name = raw_name(&unique("raw-handoff"));
    let (mut holder, holder_lease) = raw(endpoints).await?;
    let (waiter, waiter_lease) = raw(endpoints).await?;
    let mut samples = Vec::new();
    for i in 0..WARMUP / 4 + HANDOFFS {
        let held = holder
            .lock(
                name.as_str(),
                Some(LockOptions::new().with_lease(holder_lease)),
            )
            .await?;
        let (mut waiter, name) = (waiter.clone(), name.clone());
        let waiting = tokio::spawn(async move {
            let got = waiter
                .lock(
                    name.as_str(),
                    Some(LockOptions::new().with_lease(waiter_lease)),
                )
                .await?;
            let at = Instant::now();
            waiter.unlock(got.key()).await?;
            Ok::<_, etcd_client::Error>(at)
        });
        tokio::time::sleep(QUEUE_SETTLE).await;
        let released = Instant::now();
        holder.unlock(held.key()).await?;
        let got = waiting.await??;
        if i >= WARMUP / 4 {
            samples.push(got - released);
        }
    }
    holder.lease_revoke(holder_lease).await?;
    holder.lease_revoke(waiter_lease).await?;
    Ok(Summary::of(&mut samples).ok_or("no samples")?)
}
