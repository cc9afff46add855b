//! The PostgreSQL suite: dlock's acquire+release cycle against a bare
//! `pg_try_advisory_lock` / `pg_advisory_unlock` loop on one connection
//! with `tokio-postgres`, on the same server, in the same run.
//!
//! - **Cycle latency** (one client, one key, no contention): the bare loop
//!   is two round trips with no write; dlock's cycle is two round trips
//!   too (the try with the fence upsert, the release with the row cleared
//!   and the `NOTIFY`), each a committed write. The ratio is what the
//!   fencing token and the holder's row cost (on a server with `fsync` on,
//!   two commits). The kinds of cycle run interleaved, one of each per
//!   round in a rotating order.
//! - **Contended throughput** (8 clients, each its own backend, one key):
//!   dlock hands the lock over through `NOTIFY`; the bare loop runs the same
//!   try/unlock pairs on 8 connections, which exclude each other only as
//!   far as a failed try (no waiting), so it is the server's ceiling for
//!   this traffic, not a lock.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::postgres::{advisory_key, PostgresBackend};
use dlock::{Lock, LockBackend};
use tokio_postgres::{Client, NoTls, Statement};

use super::cycle_suite::{
    self, contended_against_bare, lock_on, uncontended, Cycle as _, Uncontended, CLIENTS, CYCLES,
    WARMUP, WINDOW,
};
use super::workloads::BoxError;

/// A bare connection, its two prepared statements and the advisory lock
/// they take.
struct Bare {
    client: Client,
    try_lock: Statement,
    unlock: Statement,
    id: i64,
}

impl Bare {
    async fn connect(url: &str, id: i64) -> Result<Bare, BoxError> {
        let (client, connection) = url
            .parse::<tokio_postgres::Config>()?
            .connect(NoTls)
            .await?;
        tokio::spawn(connection);
        let try_lock = client
            .prepare("SELECT pg_try_advisory_lock($1::int8)")
            .await?;
        let unlock = client
            .prepare("SELECT pg_advisory_unlock($1::int8)")
            .await?;
        Ok(Bare {
            client,
            try_lock,
            unlock,
            id,
        })
    }
}

impl cycle_suite::Cycle for Bare {
    /// One try, and the unlock if it was granted; whether it was.
    async fn cycle(&self) -> Result<bool, BoxError> {
        let id = self.id;
        let granted: bool = self.client.query_one(&self.try_lock, &[&id]).await?.get(0);
        if granted {
            self.client.query_one(&self.unlock, &[&id]).await?;
        }
        Ok(granted)
    }
}

/// Runs the PostgreSQL suite against `url` (`postgres://user@host:port/db`,
/// no dlock parameters: the bare loop reads it too) and prints the table.
///
/// # Errors
/// Any connection or server error, with the server's message.
pub async fn run(url: &str, beside: Option<&str>) -> Result<(), BoxError> {
    let key = format!("bench:{}", std::process::id());
    let id = advisory_key(&key);
    let mut backends = Vec::new();
    let mut bare = Vec::new();
    for _ in 0..CLIENTS {
        backends.push(Arc::new(PostgresBackend::connect(url).await?));
        bare.push(Arc::new(Bare::connect(url, id).await?));
    }
    let fsync = bare[0].client.query_one("SHOW fsync", &[]).await?;
    let fsync: &str = fsync.get(0);
    println!(
        "PostgreSQL bench on {} (fsync={fsync}): {CYCLES} cycles after {WARMUP} warm-up; {CLIENTS} clients for {WINDOW:?}",
        dlock::url::redact(url),
    );
    let redis: Option<Arc<dyn LockBackend>> = match beside {
        Some(other) => Some(dlock::connect(other).await?),
        None => None,
    };
    let latency = interleaved_latency(&backends[0], &key, &bare[0], redis.as_ref()).await?;
    let (compared, bare_rates) =
        contended_against_bare(latency, &backends, &key, &bare, WINDOW).await?;
    compared.print_bare_table(
        "PostgreSQL: dlock vs a bare pg_try_advisory_lock/pg_advisory_unlock loop",
        "bare tokio-postgres",
        CLIENTS,
    );
    let (acquire, try_acquire) = compared.p50_ratios();
    println!(
        "\nacquire+release p50 = {acquire:.2}× the bare try+unlock pair; try_acquire+release p50 = {try_acquire:.2}×; the bare contended loop was granted {:.0}/s",
        bare_rates.granted,
    );
    if let (Some(other), Some(cycle)) = (beside, latency.beside) {
        println!(
            "dlock on {} in the same run, interleaved: acquire+release p50 {:.0} µs, p99 {:.0} µs ({:.2}× dlock on PostgreSQL's p50)",
            dlock::url::redact(other),
            cycle.p50.as_secs_f64() * 1e6,
            cycle.p99.as_secs_f64() * 1e6,
            cycle.p50.as_secs_f64() / latency.ours.p50.as_secs_f64(),
        );
    }
    Ok(())
}

/// The uncontended cycles, interleaved: dlock's acquire and try_acquire on
/// PostgreSQL, the bare loop, and dlock on `beside` if given.
async fn interleaved_latency(
    backend: &Arc<PostgresBackend>,
    key: &str,
    bare: &Bare,
    beside: Option<&Arc<dyn LockBackend>>,
) -> Result<Uncontended, BoxError> {
    let lock = lock_on(backend, key).wait(Duration::from_secs(10));
    let other = beside.map(|b| {
        Lock::new(key)
            .with_backend(b.clone())
            .wait(Duration::from_secs(10))
    });
    uncontended(&lock, other.as_ref(), WARMUP, CYCLES, async || {
        if !bare.cycle().await? {
            return Err("the bare loop found the bench key held".into());
        }
        Ok(())
    })
    .await
}
