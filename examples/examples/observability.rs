//! Locks an operator can see: a few workers contend on real keys while
//! every acquisition, hold, renewal and loss shows up as Prometheus metrics
//! on `/metrics`, and every log line written inside a critical section
//! names the lock that guards it.
//!
//! ```text
//! cargo run -p dlock-examples --example observability --features observability
//! curl -s http://127.0.0.1:9898/metrics | grep dlock_
//! ```
//!
//! Environment: `DLOCK_URL` (default `memory://`), `DLOCK_METRICS_ADDR`
//! (default `127.0.0.1:9898`; loopback only), `DLOCK_DEMO_SECS` (how long
//! the workers run; default 60).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock::{distributed_lock, LockError, LockGuard, SegmentedLock, Semaphore};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Charges an order: a critical section that outlives one renewal interval.
#[distributed_lock(key = "order:{id}", ttl = "300ms", wait = "2s")]
async fn charge(id: u32, guard: &LockGuard) -> Result<(), LockError> {
    tracing::info!(fence = guard.fencing_token(), "charging the card");
    tokio::time::sleep(Duration::from_millis(150)).await;
    Ok(())
}

/// A nightly report that overruns its lease (renewal off): the lease is
/// lost, the body is cancelled, and the loss is logged and counted.
#[distributed_lock(key = "report", ttl = "200ms", renew = false, wait = "1s")]
async fn report() -> Result<(), LockError> {
    tracing::info!("building the report");
    tokio::time::sleep(Duration::from_millis(400)).await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_target(false)
        .init();
    let addr: SocketAddr = std::env::var("DLOCK_METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9898".into())
        .parse()?;
    if !addr.ip().is_loopback() {
        return Err(format!("DLOCK_METRICS_ADDR {addr} is not a loopback address").into());
    }
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://".into());
    dlock::registry().set_default(dlock::connect(&url).await?);
    let secs = std::env::var("DLOCK_DEMO_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let until = Instant::now() + Duration::from_secs(secs);
    tracing::info!(%addr, %url, secs, "scrape http://{addr}/metrics");

    let mut workers = Vec::new();
    for worker in 0..4u32 {
        workers.push(tokio::spawn(async move {
            let mut order = worker;
            while Instant::now() < until {
                order = order % 3 + 1;
                if let Err(e) = charge(order).await {
                    tracing::warn!(error = %e, "could not charge");
                }
            }
        }));
    }
    workers.push(tokio::spawn(async move {
        let exports = Semaphore::new("exports", 2).wait(Duration::from_secs(2));
        let stock = SegmentedLock::new("stock:7", 4).wait(Duration::from_secs(2));
        while Instant::now() < until {
            if let Ok(permit) = exports.acquire().await {
                tokio::time::sleep(Duration::from_millis(50)).await;
                drop(permit);
            }
            if let Ok(row) = stock.acquire().await {
                tokio::time::sleep(Duration::from_millis(20)).await;
                row.release().await.ok();
            }
        }
    }));
    workers.push(tokio::spawn(async move {
        while Instant::now() < until {
            if let Err(e) = report().await {
                tracing::warn!(error = %e, "report cut short");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }));
    for worker in workers {
        worker.await?;
    }
    Ok(())
}
