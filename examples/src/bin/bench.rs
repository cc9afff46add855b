//! `cargo run --release -p dlock-examples --bin bench -- <url>`
//!
//! Measures dlock against a hand-written baseline on the server at `<url>`
//! (`redis://…`, `redlock://h:p,h:p,h:p`, `etcd://…`, `zk://…`) and prints a table of ratios.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: bench <url>   (redis://127.0.0.1:6379, redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003, etcd://127.0.0.1:2379, zk://127.0.0.1:2181)");
        return ExitCode::FAILURE;
    };
    let scheme = dlock::url::scheme(&url).unwrap_or("");
    let result: Result<(), Box<dyn std::error::Error>> = match scheme {
        "redis" | "rediss" => dlock_examples::bench::redis::run(&url).await,
        "etcd" => dlock_examples::bench::etcd::run(&url).await,
        "zk" => dlock_examples::bench::zookeeper::run(&url).await,
        "redlock" => dlock_examples::bench::redlock::run(&url).await,
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
