//! A separate process that takes a lock, for the cross-process and crash tests.
//!
//! `lock-holder <url> <key> <ttl_ms> <hold_ms> [cycles] [marks_file]`
//!
//! Each cycle acquires the lock (waiting without limit), prints
//! `ACQUIRED <fencing token>`, appends `start <pid> <token>` to `marks_file`
//! if given, holds for `hold_ms`, appends `end <pid> <token>`, releases and
//! prints `RELEASED`. Tests kill it with SIGKILL to simulate a crashed holder,
//! or run two of them and check the marks never interleave.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lock-holder: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, ttl_ms, hold_ms, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: lock-holder <url> <key> <ttl_ms> <hold_ms> [cycles] [marks_file]".into(),
        );
    };
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let hold = Duration::from_millis(hold_ms.parse()?);
    let cycles: u32 = rest.first().map(|c| c.parse()).transpose()?.unwrap_or(1);
    let marks = rest.get(1);
    let backend = dlock::connect(url).await?;
    let lock = dlock::Lock::new(key.as_str())
        .ttl(ttl)
        .with_backend(backend);
    let pid = std::process::id();
    let mark = |what: &str, token: &str| -> std::io::Result<()> {
        if let Some(path) = marks {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            writeln!(file, "{what} {pid} {token}")?;
            file.sync_data()?;
        }
        Ok(())
    };
    for _ in 0..cycles {
        let guard = lock.acquire().await?;
        let token = guard
            .fencing_token()
            .map_or_else(|| "none".to_owned(), |t| t.to_string());
        println!("ACQUIRED {token}");
        std::io::stdout().flush()?;
        mark("start", &token)?;
        tokio::time::sleep(hold).await;
        mark("end", &token)?;
        guard.release().await?;
        println!("RELEASED");
        std::io::stdout().flush()?;
    }
    Ok(())
}
