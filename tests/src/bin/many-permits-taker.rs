//! A separate process that takes several permits of a semaphore at once,
//! for the multi-process test of `Semaphore::acquire_many`
//! (`tests/src/semaphore/processes.rs`).
//!
//! `many-permits-taker <url> <name> <permits> <n> <log> <hold_ms> <rounds> <id>`
//!
//! Connects, prints `WAITING`, then `rounds` times: takes `n` permits as one
//! (waiting up to two minutes), appends `+<n> <id>` to the file `log`,
//! holds them `hold_ms`, appends `-<n> <id>`, releases. Each line is one
//! `write` to a file opened for appending, so the lines of all the takers
//! interleave whole; a `+` is written after the grant and a `-` before the
//! release, so the running sum of the file never exceeds what the server
//! let out. Prints `DONE` at the end.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("many-permits-taker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn append(log: &str, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().append(true).open(log)?;
    file.write_all(line.as_bytes())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, permits, n, log, hold_ms, rounds, id] = args.as_slice() else {
        return Err(
            "usage: many-permits-taker <url> <name> <permits> <n> <log> <hold_ms> <rounds> <id>"
                .into(),
        );
    };
    let n: usize = n.parse()?;
    let hold = Duration::from_millis(hold_ms.parse()?);
    let backend = dlock::connect(url).await?;
    let semaphore = dlock::Semaphore::new(name.as_str(), permits.parse()?)
        .wait(Duration::from_secs(120))
        .with_backend(backend);
    println!("WAITING");
    std::io::stdout().flush()?;
    for _ in 0..rounds.parse::<usize>()? {
        let permit = semaphore.acquire_many(n).await?;
        append(log, &format!("+{n} {id}\n"))?;
        tokio::time::sleep(hold).await;
        append(log, &format!("-{n} {id}\n"))?;
        permit.release().await?;
    }
    println!("DONE");
    std::io::stdout().flush()?;
    Ok(())
}
