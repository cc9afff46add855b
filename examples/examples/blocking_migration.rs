//! A blocking program: a migration tool with a plain `fn main()` and no
//! async runtime. It connects, takes the lock, does its steps with
//! blocking calls for longer than the lock's ttl (dlock's own thread renews
//! the lease meanwhile), checks it still holds the lock before each step,
//! and releases it.
//!
//! ```sh
//! cargo run -p dlock-examples --example blocking_migration
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-examples --example blocking_migration
//! ```
//!
//! Exit codes: 0 migrated, 75 another instance holds the lock, 1 an error
//! (the lock lost midway included).

use std::process::ExitCode;
use std::time::Duration;

use dlock::{Lock, LockError};

/// The lease: short, so that the steps below outlast it several times.
const TTL: Duration = Duration::from_secs(1);
/// One step of the migration, as a blocking call (a synchronous database
/// driver, a file copy).
const STEP: Duration = Duration::from_millis(400);
const STEPS: usize = 8;

fn main() -> ExitCode {
    match migrate() {
        Ok(()) => ExitCode::SUCCESS,
        Err(LockError::Busy { .. } | LockError::Timeout { .. }) => {
            eprintln!("another instance is migrating; nothing done");
            ExitCode::from(75)
        }
        Err(e) => {
            eprintln!("migration failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn migrate() -> Result<(), LockError> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://".to_owned());
    let backend = dlock::connect_blocking(&url)?;
    let lock = Lock::new("migration:2026-11")
        .with_backend(backend)
        .ttl(TTL)
        .wait(Duration::ZERO);
    let guard = lock.acquire_blocking()?;
    println!(
        "holding the migration lock (fencing token {:?})",
        guard.fencing_token()
    );
    for step in 1..=STEPS {
        // Pass the fencing token with each write where the store can check it;
        // at least stop before a step once the lease is gone.
        if !guard.is_held() {
            return Err(LockError::Lost {
                key: "migration:2026-11".to_owned(),
            });
        }
        std::thread::sleep(STEP);
        println!("step {step}/{STEPS} done");
    }
    guard.release_blocking()?;
    println!(
        "migrated in {} steps of {STEP:?}, {:?} in all with a {TTL:?} ttl: held throughout",
        STEPS,
        STEP * STEPS as u32
    );
    Ok(())
}
