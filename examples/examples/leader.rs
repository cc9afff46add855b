//! Leader election: candidates campaign for `scheduler`, one leads at a
//! time with a term that fences its writes, and everybody sees who leads.
//!
//! Each candidate leads for 2 s, announces a new address halfway
//! (`proclaim`: same term), resigns, and campaigns again, 3 times; an
//! observer prints every change. With `memory://` (the default) two
//! candidates run in this process; with a server URL, run it in two
//! terminals and watch them take turns:
//!
//! ```sh
//! cargo run -p dlock-examples --example leader
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-examples --example leader -- node-a
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-examples --example leader -- node-b
//! ```

use std::time::Duration;

use dlock::{Election, LockBackend, LockError};
use std::sync::Arc;
use tokio::time::sleep;

const TERMS: usize = 3;
const LEAD_FOR: Duration = Duration::from_secs(2);

/// Campaigns `TERMS` times as `name`, leading `LEAD_FOR` each time.
async fn candidate(backend: Arc<dyn LockBackend>, name: String) -> Result<(), LockError> {
    let election = Election::new("scheduler")
        .with_backend(backend)
        .ttl(Duration::from_secs(5));
    for _ in 0..TERMS {
        let leadership = election.campaign(format!("{name}:8080")).await?;
        let term = leadership.term();
        println!("{name}: elected, term {term}; every write carries it as its fencing token");
        tokio::select! {
            _ = leadership.lost() => {
                println!("{name}: lost the leadership of term {term}; stop acting as leader");
                continue;
            }
            _ = sleep(LEAD_FOR / 2) => {}
        }
        // Right before each act of the leader: still leading? (No round trip;
        // a process resumed from a pause is refused here before `lost()` fires.)
        if leadership.ensure().is_err() {
            println!("{name}: term {term} is over; not acting on it");
            continue;
        }
        leadership.proclaim(format!("{name}:9090")).await?;
        sleep(LEAD_FOR / 2).await;
        leadership.resign().await?;
        println!("{name}: resigned term {term}");
        // Let the other candidate win the next term.
        sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://".into());
    let backend = dlock::connect(&url).await?;

    // Who leads, as any process sees it: each change, woken by the server.
    let observer = tokio::spawn({
        let election = Election::new("scheduler").with_backend(backend.clone());
        async move {
            use futures_util::StreamExt;
            let mut changes = election.observe();
            while let Some(change) = changes.next().await {
                match change {
                    Some(leader) => println!("  observer: {leader} leads"),
                    None => println!("  observer: nobody leads"),
                }
            }
        }
    });

    let names: Vec<String> = match std::env::args().nth(1) {
        Some(name) => vec![name],
        // One process, one memory:// table: two candidates in it.
        None if url.starts_with("memory") => vec!["node-a".into(), "node-b".into()],
        None => vec![format!("node-{}", std::process::id())],
    };
    let mut candidates = Vec::new();
    for name in names {
        candidates.push(tokio::spawn(candidate(backend.clone(), name)));
    }
    for candidate in candidates {
        candidate.await.expect("a candidate panicked")?;
    }
    sleep(Duration::from_millis(100)).await;
    observer.abort();
    Ok(())
}
