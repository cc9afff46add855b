//! A separate process that holds a lock or leads an election and makes a
//! side effect on request, each one right after `ensure()`: for the tests
//! that freeze it (SIGSTOP) past its ttl and resume it.
//!
//! `ensure-holder <url> <lock|lead> <name> <ttl_ms> <effects_file>`
//!
//! Prints `ACQUIRED <fence or term>` once it holds the lock (or leads).
//! Then for each `write` line on stdin: `ensure()`, and if that passes,
//! appends `write <fence>` to `effects_file` and prints `WROTE`; if it
//! refuses, prints `REFUSED <error>` and writes nothing. Exits at the end
//! of stdin.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ensure-holder: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The lock or the leadership, whichever the process holds.
enum Held {
    Lock(dlock::LockGuard),
    Lead(dlock::Leadership),
}

impl Held {
    fn ensure(&self) -> Result<(), dlock::LockError> {
        match self {
            Held::Lock(guard) => guard.ensure(),
            Held::Lead(leadership) => leadership.ensure(),
        }
    }

    fn fence(&self) -> u64 {
        match self {
            Held::Lock(guard) => guard.fencing_token().unwrap_or(0),
            Held::Lead(leadership) => leadership.term(),
        }
    }
}

fn say(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout();
    writeln!(out, "{line}")?;
    out.flush()
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, what, name, ttl_ms, effects] = args.as_slice() else {
        return Err("usage: ensure-holder <url> <lock|lead> <name> <ttl_ms> <effects_file>".into());
    };
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let backend = dlock::connect(url).await?;
    let held = match what.as_str() {
        "lock" => Held::Lock(
            dlock::Lock::new(name.as_str())
                .ttl(ttl)
                .with_backend(backend)
                .acquire()
                .await?,
        ),
        "lead" => Held::Lead(
            dlock::Election::new(name.as_str())
                .ttl(ttl)
                .with_backend(backend)
                .campaign(format!("ensure-holder-{}", std::process::id()))
                .await?,
        ),
        other => return Err(format!("`{other}` is neither `lock` nor `lead`").into()),
    };
    say(&format!("ACQUIRED {}", held.fence()))?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        if line.trim() != "write" {
            return Err(format!("unknown request {line:?}").into());
        }
        match held.ensure() {
            Ok(()) => {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(effects)?;
                writeln!(file, "write {}", held.fence())?;
                file.sync_data()?;
                say("WROTE")?;
            }
            Err(e) => say(&format!("REFUSED {e}"))?,
        }
    }
    Ok(())
}
