//! A full PostgreSQL lock table: the server keeps every advisory lock in
//! one shared table sized for about `max_locks_per_transaction` times
//! (`max_connections` plus `max_prepared_transactions`) entries. Asking
//! for more locks than fit is a refusal naming the setting, and no lease
//! already granted is lost because another acquisition failed. The server
//! here has a small table (10 × 20), so the test fills it in a second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::postgres::PostgresBackend;
use dlock::{Lock, LockBackend, LockGuard};
use dlock_tests::servers::postgres::PgServer;
use tokio::task::JoinSet;

/// More locks than a table of 10 × 20 (plus the server's slack) holds.
const ASKED: usize = 3_000;
/// Acquisitions in flight at once.
const IN_FLIGHT: usize = 50;
const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_lock_table_refuses_by_name_and_loses_no_granted_lease() {
    let server =
        PgServer::start_with_settings(&["max_locks_per_transaction=10", "max_connections=20"]);
    let backend: Arc<dyn LockBackend> =
        Arc::new(PostgresBackend::connect(&server.url()).await.unwrap());
    let started = Instant::now();
    let mut guards: Vec<LockGuard> = Vec::new();
    let mut refusals: Vec<String> = Vec::new();
    for batch in 0..ASKED / IN_FLIGHT {
        let mut taking = JoinSet::new();
        for i in batch * IN_FLIGHT..(batch + 1) * IN_FLIGHT {
            let lock = Lock::new(format!("lock-table:{i:05}"))
                .with_backend(backend.clone())
                .ttl(TTL);
            taking.spawn(async move { lock.try_acquire().await });
        }
        while let Some(taken) = taking.join_next().await {
            match taken.unwrap() {
                Ok(Some(guard)) => guards.push(guard),
                Ok(None) => panic!("a fresh key was busy"),
                Err(e) => refusals.push(e.to_string()),
            }
        }
    }
    eprintln!(
        "{} granted, {} refused of {ASKED} in {:?}; first refusal: {}",
        guards.len(),
        refusals.len(),
        started.elapsed(),
        refusals.first().map_or("none", String::as_str)
    );
    assert!(
        !refusals.is_empty(),
        "the table never filled: {} granted",
        guards.len()
    );
    assert!(guards.len() > 100, "only {} granted", guards.len());
    for refusal in &refusals {
        assert!(
            refusal.contains("max_locks_per_transaction"),
            "a refusal does not name the setting: {refusal}; the server's log:\n{}",
            server_log(&server)
        );
    }
    // Three ttls: every lease renews about nine times, with the table full.
    tokio::time::sleep(TTL * 3).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(
        lost,
        0,
        "{lost} of {} granted leases lost; the server's log:\n{}",
        guards.len(),
        server_log(&server)
    );
    // Each is still the server's: released, each was held by its session.
    let held = guards.len();
    let mut released = 0;
    for guard in guards {
        if guard.release().await.is_ok() {
            released += 1;
        }
    }
    assert_eq!(released, held, "some releases failed");
    // With the table empty again, a lock is granted as before.
    let again = Lock::new("lock-table:after")
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("the key is free");
    again.release().await.unwrap();
}

/// The server's log lines that are not routine, for a failure's message.
fn server_log(server: &PgServer) -> String {
    let text = std::fs::read_to_string(server.dir().join("postgres.log")).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("FATAL") || l.contains("could not") || l.contains("terminating"))
        .collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
