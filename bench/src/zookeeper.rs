//! The ZooKeeper suite: dlock's acquire+release cycle against a raw
//! create-ephemeral-sequential/delete loop with `zookeeper-client`, on the
//! same server, in the same run.
//!
//! - **Cycle latency** (one client, one key, no contention): the raw loop is
//!   create + delete; dlock's `acquire` and `try_acquire` cycles add the
//!   queue check (a listing of the key's children). The ratio is what the
//!   queue check and the fencing token cost. The three kinds of cycle run
//!   interleaved, one of each per round in a rotating order, so a burst of
//!   load from whatever else shares the machine hits all three alike.
//! - **Contended throughput** (8 clients, each its own session, one key):
//!   dlock hands the lock over through the predecessor watch; the raw loop
//!   runs the same create/delete pairs with no exclusion at all, so it is
//!   the server's ceiling for this traffic, not a lock.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::zookeeper::ZooKeeperBackend;
use zookeeper_client::{Acls, Client, CreateMode};

use super::cycle_suite::{
    self, dlock_throughput, lock_on, throughput, uncontended, Compared, Uncontended, CLIENTS,
    CYCLES, WARMUP, WINDOW,
};

use super::workloads::BoxError;

/// Runs the ZooKeeper suite against `url` (`zk://host:port[/chroot]`) and
/// prints the table.
///
/// # Errors
/// Any connection or server error, with the server's message.
pub async fn run(url: &str) -> Result<(), BoxError> {
    let run_id = std::process::id();
    let key = format!("bench:{run_id}");
    let raw_dir = format!("/dlock-bench-raw/{run_id}");

    let backends = connect_all(url, CLIENTS).await?;
    // The raw loop gets its own sessions, so its clients do not share a
    // connection with dlock's.
    let raw_backends = connect_all(url, CLIENTS).await?;
    let raw: Vec<Client> = raw_backends
        .iter()
        .map(|b| b.client().ok_or("a freshly opened session already ended"))
        .collect::<Result<_, _>>()?;
    raw[0]
        .mkdir(
            &raw_dir,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await?;

    println!(
        "ZooKeeper bench on {} (session timeout {:?}): {CYCLES} cycles after {WARMUP} warm-up; {CLIENTS} clients for {WINDOW:?}",
        dlock::url::redact(url),
        backends[0].session_timeout()
    );

    let latency = interleaved_latency(&backends[0], &key, &raw[0], &raw_dir).await?;
    let ours_per_sec = dlock_throughput(&backends, &key, WINDOW).await?;
    let raw_loops = raw.iter().map(|client| RawLoop {
        client: client.clone(),
        dir: raw_dir.clone(),
    });
    let raw_rates = throughput(raw_loops, WINDOW).await?;

    let _ = raw[0].delete(&raw_dir, None).await;
    let _ = raw[0].delete("/dlock-bench-raw", None).await;

    let compared = Compared {
        latency,
        ours_per_sec,
        theirs_per_sec: raw_rates.cycles,
    };
    compared.print_table(
        "ZooKeeper: dlock vs raw create-ephemeral-sequential/delete",
        "raw zookeeper-client",
        true,
        &format!("cycles/s, {CLIENTS} clients, one key (raw: no exclusion)"),
    );
    let (acquire, try_acquire) = compared.p50_ratios();
    println!(
        "\nacquire+release p50 = {acquire:.2}× the raw create+delete pair; try_acquire+release p50 = {try_acquire:.2}×"
    );
    Ok(())
}

async fn connect_all(url: &str, n: usize) -> Result<Vec<Arc<ZooKeeperBackend>>, BoxError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Arc::new(ZooKeeperBackend::connect(url).await?));
    }
    Ok(out)
}

/// The latency of dlock's `acquire` and `try_acquire` cycles and of the raw
/// pair, in that order.
async fn interleaved_latency(
    backend: &Arc<ZooKeeperBackend>,
    key: &str,
    raw: &Client,
    raw_dir: &str,
) -> Result<Uncontended, BoxError> {
    let lock = lock_on(backend, key).wait(Duration::from_secs(10));
    uncontended(&lock, None, WARMUP, CYCLES, async || {
        raw_cycle(raw, raw_dir).await
    })
    .await
}

async fn raw_cycle(client: &Client, dir: &str) -> Result<(), BoxError> {
    let prefix = format!("{dir}/_c_bench-lock-");
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, seq) = client.create(&prefix, b"", &options).await?;
    client.delete(&format!("{prefix}{seq}"), None).await?;
    Ok(())
}

/// One raw client's create/delete pairs under `dir`, for the throughput
/// window.
struct RawLoop {
    client: Client,
    dir: String,
}

impl cycle_suite::Cycle for RawLoop {
    async fn cycle(&self) -> Result<bool, BoxError> {
        raw_cycle(&self.client, &self.dir).await?;
        Ok(true)
    }
}
