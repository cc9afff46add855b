//! A separate process that holds a semaphore permit, for the crash tests.
//!
//! `permit-holder <url> <name> <permits> <ttl_ms> <hold_ms>`
//!
//! Takes one permit of the semaphore `name` (waiting without limit), prints
//! `ACQUIRED <permit token>`, holds it for `hold_ms`, releases it and prints
//! `RELEASED`. Tests kill it with SIGKILL to simulate a crashed holder.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("permit-holder: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, permits, ttl_ms, hold_ms] = args.as_slice() else {
        return Err("usage: permit-holder <url> <name> <permits> <ttl_ms> <hold_ms>".into());
    };
    let backend = dlock::connect(url).await?;
    let semaphore = dlock::Semaphore::new(name.as_str(), permits.parse()?)
        .ttl(Duration::from_millis(ttl_ms.parse()?))
        .with_backend(backend);
    let permit = semaphore.acquire().await?;
    println!("ACQUIRED {}", permit.token());
    std::io::stdout().flush()?;
    tokio::time::sleep(Duration::from_millis(hold_ms.parse()?)).await;
    permit.release().await?;
    println!("RELEASED");
    std::io::stdout().flush()?;
    Ok(())
}
