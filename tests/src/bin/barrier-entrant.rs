//! A separate process that enters a double barrier and stays in it, for
//! the tests where a member's process dies.
//!
//! `barrier-entrant <url> <name> <parties> <ttl_ms>`
//!
//! Enters the barrier `name` of `parties` (waiting up to a minute) with a
//! member ttl of `ttl_ms`, prints `ENTERED`, then stays in for up to an
//! hour. Tests kill it with SIGKILL: a dead process neither renews nor
//! leaves.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("barrier-entrant: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, parties, ttl_ms] = args.as_slice() else {
        return Err("usage: barrier-entrant <url> <name> <parties> <ttl_ms>".into());
    };
    let backend = dlock::connect(url).await?;
    let member = dlock::Barrier::new(name.as_str(), parties.parse()?)
        .ttl(Duration::from_millis(ttl_ms.parse()?))
        .wait(Duration::from_secs(60))
        .with_backend(backend)
        .enter()
        .await?;
    println!("ENTERED");
    std::io::stdout().flush()?;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    member.leave().await?;
    Ok(())
}
