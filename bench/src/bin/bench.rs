//! `cargo run --release -p dlock-bench --bin bench -- <url> [--segments] [--observed-detail]`
//!
//! Measures dlock against a hand-written baseline on the server at `<url>`
//! (`redis://…`, `redlock://h:p,h:p,h:p`, `etcd://…`, `zk://…`) and prints a table of ratios.
//!
//! `--segments` (Redis only) runs the hot-key suite instead: one key, 64
//! tasks, a single `Lock` against `SegmentedLock` with 4 and 8 segments and
//! a `Semaphore` with 4 permits, in critical sections per second.
//!
//! The Redis suite ends with workload (b) with observability on (a
//! Prometheus recorder and a `tracing` subscriber at INFO) against off;
//! `--observed-detail` adds the recorder alone and the subscriber alone.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let segments = args.iter().any(|a| a == "--segments");
    let observed_detail = args.iter().any(|a| a == "--observed-detail");
    let Some(url) = args.iter().find(|a| !a.starts_with("--")).cloned() else {
        eprintln!("usage: bench <url> [--segments] [--observed-detail]   (redis://127.0.0.1:6379, redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003, etcd://127.0.0.1:2379, zk://127.0.0.1:2181)");
        return ExitCode::FAILURE;
    };
    let scheme = dlock::url::scheme(&url).unwrap_or("");
    let result: Result<(), Box<dyn std::error::Error>> = match scheme {
        "redis" | "rediss" if segments => dlock_bench::segments::run(&url).await,
        "redis" | "rediss" => dlock_bench::redis::run(&url, observed_detail).await,
        "etcd" => dlock_bench::etcd::run(&url).await,
        "zk" => dlock_bench::zookeeper::run(&url).await,
        "redlock" => dlock_bench::redlock::run(&url).await,
        other => Err(format!(
            "no benchmark suite for `{other}://` URLs; give a redis://, redlock://, etcd:// or zk:// URL"
        )
        .into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}
