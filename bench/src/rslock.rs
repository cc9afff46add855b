//! The `rslock` crate (0.10, the Rust Redlock peer) as a baseline: on a set
//! of masters in the Redlock suite, on the one server in the Redis suite
//! (rslock with one server is the plain `SET NX PX` lock most Rust services
//! use). It waits by retrying after a random delay up to its default 200 ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rslock::{Lock, LockManager};

use super::stats::Summary;
use super::workloads::{BoxError, HotLock, Sizes, TTL};

/// An rslock manager over `node_urls` (`redis://host:port` each).
/// `LockManager::new` panics on a bad URL; the clients are opened here.
pub fn manager(node_urls: &[String]) -> Result<LockManager, BoxError> {
    let clients = node_urls
        .iter()
        .map(|u| redis::Client::open(u.as_str()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LockManager::from_clients(clients))
}

/// One round of (a): `cycles` acquire+release cycles, each one's duration.
pub async fn uncontended(
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

/// (b): `sizes.distinct_tasks` tasks, each on a key of its own named
/// `{prefix}:{task}`; cycles per second.
pub async fn distinct(sizes: &Sizes, rs: &LockManager, prefix: &str) -> Result<f64, BoxError> {
    let sizes = *sizes;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..sizes.distinct_tasks {
        let (rs, key) = (rs.clone(), format!("{prefix}:{t}"));
        tasks.push(tokio::spawn(async move {
            for _ in 0..sizes.distinct_cycles {
                let lock = rs.lock(key.as_bytes(), TTL).await?;
                rs.unlock(&lock).await;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((sizes.distinct_tasks * sizes.distinct_cycles) as f64 / start.elapsed().as_secs_f64())
}

/// (c)'s side for rslock: `acquire` retries until it gets the lock.
#[derive(Clone)]
pub struct RsLock {
    rs: LockManager,
    key: Arc<str>,
}

impl RsLock {
    pub fn new(rs: &LockManager, key: &str) -> Self {
        RsLock {
            rs: rs.clone(),
            key: key.into(),
        }
    }
}

impl HotLock for RsLock {
    type Held = Lock;

    async fn lock(&self) -> Result<Lock, BoxError> {
        Ok(self.rs.acquire_no_guard(self.key.as_bytes(), TTL).await?)
    }

    async fn unlock(&self, held: Lock) -> Result<(), BoxError> {
        self.rs.unlock(&held).await;
        Ok(())
    }
}

/// (d): release → next holder (in another client), `sizes.handoffs` times.
pub async fn handoff(
    sizes: &Sizes,
    holder: &LockManager,
    waiter: &LockManager,
    key: &str,
) -> Result<Summary, BoxError> {
    let mut samples = Vec::with_capacity(sizes.handoffs);
    for _ in 0..sizes.handoffs {
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
