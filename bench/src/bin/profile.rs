//! `cargo run --release -p dlock-bench --bin profile -- <url> [rounds]`
//!
//! Workload (b) of the bench, dlock's side alone (64 tasks, each on its own
//! key, 2,000 acquire+release cycles per task per round), for a profiler to
//! watch: `perf record -g --call-graph dwarf target/release/profile
//! redis://127.0.0.1:6379`. Prints each round's cycles per second and this
//! process's CPU per cycle (all threads).

use std::process::ExitCode;
use std::sync::Arc;

use dlock::LockBackend;
use dlock_bench::observed::cpu_time;
use dlock_bench::workloads::{distinct_dlock, Sizes};

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
    let Some(url) = args.first() else {
        eprintln!("usage: profile <url> [rounds]   (e.g. redis://127.0.0.1:6379)");
        return ExitCode::FAILURE;
    };
    let rounds = match args.get(1).map(|r| r.parse::<usize>()) {
        None => 6,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("rounds must be a positive number, e.g. 6");
            return ExitCode::FAILURE;
        }
    };
    let backend: Arc<dyn LockBackend> = match dlock::connect(url).await {
        Ok(backend) => backend,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let cycles = (SIZES.distinct_tasks * SIZES.distinct_cycles) as f64;
    for round in 0..rounds {
        let before = cpu_time();
        let rate = match distinct_dlock(&SIZES, &backend, &format!("profile-{round}")).await {
            Ok(rate) => rate,
            Err(e) => {
                eprintln!("round {round}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let cpu = before
            .zip(cpu_time())
            .map(|(b, a)| a.saturating_sub(b).as_secs_f64() * 1e6 / cycles);
        match cpu {
            Some(us) => {
                println!("round {round}: {rate:.0} cycles/s, client CPU {us:.2} µs per cycle")
            }
            None => println!("round {round}: {rate:.0} cycles/s"),
        }
    }
    ExitCode::SUCCESS
}
