//! A separate process that holds a read lease of a read-write lock, for the
//! crash tests.
//!
//! `reader-holder <url> <key> <ttl_ms> <hold_ms>`
//!
//! Takes a read lease of the `RwLock` on `key` (waiting without limit),
//! prints `ACQUIRED <fencing token or ->`, holds it for `hold_ms`, releases
//! it and prints `RELEASED`. Tests kill it with SIGKILL to simulate a
//! crashed reader.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("reader-holder: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, ttl_ms, hold_ms] = args.as_slice() else {
        return Err("usage: reader-holder <url> <key> <ttl_ms> <hold_ms>".into());
    };
    let backend = dlock::connect(url).await?;
    let lock = dlock::RwLock::new(key.as_str())
        .ttl(Duration::from_millis(ttl_ms.parse()?))
        .with_backend(backend);
    let reader = lock.read().await?;
    let fence = reader
        .fencing_token()
        .map_or_else(|| "-".to_owned(), |t| t.to_string());
    println!("ACQUIRED {fence}");
    std::io::stdout().flush()?;
    tokio::time::sleep(Duration::from_millis(hold_ms.parse()?)).await;
    reader.release().await?;
    println!("RELEASED");
    std::io::stdout().flush()?;
    Ok(())
}
