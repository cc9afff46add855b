//! `cargo run --release -p dlock-bench --bin profile -- <url> [rounds] [--rslock]`
//!
//! Workload (b) of the bench, dlock's side alone (64 tasks, each on its own
//! key, 2,000 acquire+release cycles per task per round), for a profiler to
//! watch: `perf record -g --call-graph dwarf target/release/profile
//! redis://127.0.0.1:6379`. Prints each round's cycles per second, this
//! process's CPU per cycle (all threads), its heap allocations per cycle,
//! and on a Redis URL the server's CPU per cycle (`INFO cpu`).
//!
//! `--rslock` alternates each dlock round with a round of `rslock` 0.10 on
//! the same server (a Redis URL), so that the two are compared under the
//! same load from elsewhere.

use std::process::ExitCode;
use std::sync::Arc;

use dlock::LockBackend;
use dlock_bench::allocations;
use dlock_bench::observed::cpu_time;
use dlock_bench::redis_info::RedisInfo;
use dlock_bench::workloads::{distinct_dlock, BoxError, Sizes};

const SIZES: Sizes = Sizes {
    uncontended_cycles: 0,
    distinct_tasks: 64,
    distinct_cycles: 2_000,
    hot_tasks: 0,
    hot_increments: 0,
    handoffs: 0,
};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let with_rslock = args.iter().any(|a| a == "--rslock");
    let positional: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let Some(url) = positional.first() else {
        eprintln!("usage: profile <url> [rounds] [--rslock]   (e.g. redis://127.0.0.1:6379)");
        return ExitCode::FAILURE;
    };
    let rounds = match positional.get(1).map(|r| r.parse::<usize>()) {
        None => 6,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("rounds must be a positive number, e.g. 6");
            return ExitCode::FAILURE;
        }
    };
    match run(url, rounds, with_rslock).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("profile: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str, rounds: usize, with_rslock: bool) -> Result<(), BoxError> {
    let backend: Arc<dyn LockBackend> = dlock::connect(url).await?;
    let rs = if with_rslock {
        Some(dlock_bench::rslock::manager(&[url.to_owned()])?)
    } else {
        None
    };
    // The server's CPU, read around each round (Redis URLs only).
    let mut server = match dlock::url::scheme(url) {
        Some("redis" | "rediss") => Some(
            redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?,
        ),
        _ => None,
    };
    let cycles = (SIZES.distinct_tasks * SIZES.distinct_cycles) as f64;
    for round in 0..rounds {
        let measured = Measured::start(&mut server).await?;
        let rate = distinct_dlock(&SIZES, &backend, &format!("profile-{round}")).await?;
        measured
            .print(&mut server, &format!("round {round}: dlock "), rate, cycles)
            .await?;
        if let Some(rs) = &rs {
            let measured = Measured::start(&mut server).await?;
            let prefix = format!("bench:profile-rs-{round}");
            let rate = dlock_bench::rslock::distinct(&SIZES, rs, &prefix).await?;
            measured
                .print(&mut server, &format!("round {round}: rslock"), rate, cycles)
                .await?;
        }
    }
    Ok(())
}

type Server = Option<redis::aio::MultiplexedConnection>;

/// The server's CPU seconds so far, if it is a Redis server.
async fn server_cpu(server: &mut Server) -> Result<Option<f64>, BoxError> {
    match server {
        Some(conn) => Ok(Some(RedisInfo::read(conn).await?.cpu_seconds)),
        None => Ok(None),
    }
}

/// The process's CPU time, its allocation count and the server's CPU time
/// when a round began.
struct Measured {
    cpu: Option<std::time::Duration>,
    allocations: u64,
    server: Option<f64>,
}

impl Measured {
    async fn start(server: &mut Server) -> Result<Self, BoxError> {
        let server = server_cpu(server).await?;
        Ok(Measured {
            cpu: cpu_time(),
            allocations: allocations::count(),
            server,
        })
    }

    async fn print(
        self,
        server: &mut Server,
        label: &str,
        rate: f64,
        cycles: f64,
    ) -> Result<(), BoxError> {
        let allocs = allocations::per_cycle(self.allocations, allocations::count(), cycles);
        let client = self
            .cpu
            .zip(cpu_time())
            .map(|(b, a)| a.saturating_sub(b).as_secs_f64() * 1e6 / cycles);
        let server = self
            .server
            .zip(server_cpu(server).await?)
            .map(|(b, a)| (a - b) * 1e6 / cycles);
        let mut line = format!("{label} {rate:.0} cycles/s");
        if let Some(us) = client {
            line.push_str(&format!(", client CPU {us:.2} µs"));
        }
        if let Some(us) = server {
            line.push_str(&format!(", server CPU {us:.2} µs"));
        }
        println!("{line}, {allocs:.1} allocations per cycle");
        Ok(())
    }
}
