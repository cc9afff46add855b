//! A separate process that campaigns in an election, for the liveness tests
//! of paused, killed and resumed leaders.
//!
//! `election-candidate <url> <name> <value> <ttl_ms> <lifetime_ms>`
//!
//! Campaigns (waiting without limit), prints `ELECTED <term>` once elected,
//! and leads until its leadership is lost: then prints `LOST <term>`, drops
//! the leadership and campaigns again, as a service that wants to lead does
//! (after a failed campaign too, which it reports on stderr).
//! After `lifetime_ms` it resigns (or stops campaigning) and exits, so a
//! test that forgets it leaves nothing running for long. Tests pause it
//! with SIGSTOP, resume it with SIGCONT, or kill it with SIGKILL.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("election-candidate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn say(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, value, ttl_ms, lifetime_ms] = args.as_slice() else {
        return Err("usage: election-candidate <url> <name> <value> <ttl_ms> <lifetime_ms>".into());
    };
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let lifetime = Duration::from_millis(lifetime_ms.parse()?);
    let backend = dlock::connect(url).await?;
    let election = dlock::Election::new(name.as_str())
        .ttl(ttl)
        .with_backend(backend);
    let end = tokio::time::sleep(lifetime);
    tokio::pin!(end);
    loop {
        let leadership = tokio::select! {
            elected = election.campaign(value.as_str()) => match elected {
                Ok(leadership) => leadership,
                // As a service that wants to lead would: say so, and try
                // again (the test sees it in its output).
                Err(e) => {
                    eprintln!("election-candidate {value}: campaign failed: {e}; campaigning again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
            () = &mut end => return Ok(()),
        };
        let term = leadership.term();
        say(&format!("ELECTED {term}"))?;
        tokio::select! {
            () = leadership.lost() => say(&format!("LOST {term}"))?,
            () = &mut end => {
                // Best effort: the lease may have been lost meanwhile.
                let _ = leadership.resign().await;
                return Ok(());
            }
        }
    }
}
