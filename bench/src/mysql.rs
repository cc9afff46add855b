//! The MySQL suite: dlock's acquire+release cycle against a bare
//! `GET_LOCK(name, 0)` / `RELEASE_LOCK(name)` loop on one connection with
//! `mysql_async`, on the same server, in the same run.
//!
//! - **Cycle latency** (one client, one key, no contention): the bare loop
//!   is two round trips with no write; dlock's cycle is two round trips
//!   too (the try with the fence upsert, one committed InnoDB write; the
//!   release with the holder's row read). The ratio is what the fencing
//!   token and the holder's row cost. The kinds of cycle run interleaved,
//!   one of each per round in a rotating order.
//! - **Contended throughput** (8 clients, each its own backend, one key):
//!   dlock's waiters wait in the server's queue (`GET_LOCK` with a
//!   timeout); the bare loop runs the same try/release pairs on 8
//!   connections, which exclude each other only as far as a failed try (no
//!   waiting), so it is the server's ceiling for this traffic, not a lock.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::mysql::{lock_name, MysqlBackend};
use mysql_async::prelude::Queryable;
use tokio::sync::Mutex;

use super::cycle_suite::{
    self, contended_against_bare, lock_on, uncontended, Cycle as _, Uncontended, CLIENTS, CYCLES,
    WARMUP, WINDOW,
};
use super::workloads::BoxError;

/// A bare connection and the two statements of the loop.
struct Bare {
    conn: Mutex<mysql_async::Conn>,
    try_lock: String,
    release: String,
}

impl Bare {
    async fn connect(url: &str, name: &str) -> Result<Bare, BoxError> {
        let opts = mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(url)?)
            .prefer_socket(false);
        let conn = mysql_async::Conn::new(opts).await?;
        let quoted = format!("'{}'", name.replace('\'', "''"));
        Ok(Bare {
            conn: Mutex::new(conn),
            try_lock: format!("SELECT GET_LOCK({quoted}, 0)"),
            release: format!("SELECT RELEASE_LOCK({quoted})"),
        })
    }
}

impl cycle_suite::Cycle for Bare {
    /// One try, and the release if it was granted; whether it was.
    async fn cycle(&self) -> Result<bool, BoxError> {
        let mut conn = self.conn.lock().await;
        let granted: Option<Option<i64>> = conn.query_first(self.try_lock.as_str()).await?;
        let granted = granted.flatten() == Some(1);
        if granted {
            let _: Option<Option<i64>> = conn.query_first(self.release.as_str()).await?;
        }
        Ok(granted)
    }
}

/// Runs the MySQL suite against `url` (`mysql://user:pw@host:port/db`, no
/// dlock parameters: the bare loop reads it too) and prints the table.
///
/// # Errors
/// Any connection or server error, with the server's message.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let key = format!("bench:{}", std::process::id());
    // The name dlock gives the key under the URL's default prefix.
    let database = mysql_async::Opts::from_url(url)?
        .db_name()
        .unwrap_or_default()
        .to_owned();
    let name = lock_name(&database, &key);
    let mut backends = Vec::new();
    let mut bare = Vec::new();
    for _ in 0..CLIENTS {
        backends.push(Arc::new(MysqlBackend::connect(url).await?));
        bare.push(Arc::new(Bare::connect(url, &name).await?));
    }
    let version: Option<String> = bare[0]
        .conn
        .lock()
        .await
        .query_first("SELECT VERSION()")
        .await?;
    let flush: Option<String> = bare[0]
        .conn
        .lock()
        .await
        .query_first("SELECT @@innodb_flush_log_at_trx_commit")
        .await?;
    println!(
        "MySQL bench on {} ({}, innodb_flush_log_at_trx_commit={}): {CYCLES} cycles after {WARMUP} warm-up; {CLIENTS} clients for {WINDOW:?}",
        dlock::url::redact(url),
        version.unwrap_or_default(),
        flush.unwrap_or_default(),
    );
    let latency = interleaved_latency(&backends[0], &key, &bare[0]).await?;
    let (compared, bare_rates) =
        contended_against_bare(latency, &backends, &key, &bare, WINDOW).await?;
    compared.print_bare_table(
        "MySQL: dlock vs a bare GET_LOCK/RELEASE_LOCK loop",
        "bare mysql_async",
        CLIENTS,
    );
    let (acquire, try_acquire) = compared.p50_ratios();
    println!(
        "\nacquire+release p50 = {acquire:.2}× the bare GET_LOCK+RELEASE_LOCK pair (target ≤ 1.5×); try_acquire+release p50 = {try_acquire:.2}×; the bare contended loop was granted {:.0}/s",
        bare_rates.granted,
    );
    Ok(())
}

/// The uncontended cycles, interleaved: dlock's acquire and try_acquire,
/// and the bare loop.
async fn interleaved_latency(
    backend: &Arc<MysqlBackend>,
    key: &str,
    bare: &Bare,
) -> Result<Uncontended, BoxError> {
    let lock = lock_on(backend, key).wait(Duration::from_secs(10));
    uncontended(&lock, None, WARMUP, CYCLES, async || {
        if !bare.cycle().await? {
            return Err("the bare loop found the bench key held".into());
        }
        Ok(())
    })
    .await
}
