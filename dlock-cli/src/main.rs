//! `dlock`: run a command under a distributed lock, and inspect or free
//! locks, on any backend of dlock's `full` feature but the in-process one.
//!
//! Exit codes (also in `dlock --help` and `dlock::guide::operations`):
//!
//! | code | when |
//! |---|---|
//! | the command's | `run`: the command exited (128 + N if a signal N ended it) |
//! | 130 / 143 | `run`: SIGINT / SIGTERM while waiting for the lock (128 + the signal); the command did not run |
//! | 75 (`--conflict-exit-code`) | `run`: the lock was held (`--wait` ran out); the command did not run |
//! | 76 | `run`: the lease was lost while the command ran; it got SIGTERM (SIGKILL after `--grace`) |
//! | 0 / 1 | `inspect`: held / free; `release --force`: freed / was free |
//! | 69 | the service failed or refused (connection, permissions) |
//! | 64 | a bad URL, key or option (a `list --prefix` that matches more than 10,000 keys) |
//! | 2 | bad arguments (clap) |
//!
//! Every exit goes through `dlock::shutdown()`, which waits (at most 1 s)
//! for the background work of a drop, such as leaving a waiter queue: a
//! `run` that gave up waiting leaves no ticket behind.
// One exception, in `child.rs`: the `pre_exec` that sets the command's
// parent-death signal.
#![deny(unsafe_code)]

mod child;
mod run;
mod semaphores;
mod shown;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use dlock::{Lock, LockBackend, LockError, LockInfo};

/// `run`: the lease was lost while the command ran.
pub(crate) const EXIT_LOST: u8 = 76;
/// The service failed or refused.
const EXIT_UNAVAILABLE: u8 = 69;
/// A bad URL, key or option.
const EXIT_USAGE: u8 = 64;

const EXAMPLES: &str = "\
Examples:
  # one nightly job across the fleet; a second copy exits 75 at once
  DLOCK_URL=redis://redis.internal:6379 dlock run nightly-report -- ./report.sh --full

  # wait up to 10 minutes for the lock, hold it with a 1-minute lease renewed while it runs
  dlock --url etcd://10.0.0.5:2379 run --wait 10m --ttl 1m db-migrate -- make migrate

  # who holds it? (exit 0: held, 1: free)
  dlock inspect nightly-report --json

  # every held lock whose key starts with nightly-, with its holder (any backend)
  dlock list --prefix nightly- --json

  # free a stuck lock: its holder's guard reports the loss at its next renewal
  dlock release --force nightly-report

Exit codes: the command's own (128+N after signal N); 75 lock busy (--conflict-exit-code);
130/143 SIGINT/SIGTERM while waiting (the command did not run); 76 lease lost while the command ran;
0/1 held/free for inspect and release --force; 69 service failed;
64 bad URL, key or option (or a list prefix matching over 10,000 keys); 2 bad arguments.

run: the command sees DLOCK_KEY and DLOCK_FENCING_TOKEN (absent on Redlock), not DLOCK_URL.
It runs in a process group of its own: SIGINT/SIGTERM to dlock go to that whole group; a lost
lease sends the group SIGTERM (SIGKILL after --grace); processes the command leaves behind get
the same before the lock is released. If dlock dies (even by kill -9) the group gets SIGKILL from a
watcher process, and on Linux the kernel also kills the command itself (parent-death signal); other
systems have only the watcher. A waiter that gives up (--wait ran out, a signal) leaves the queue
before dlock exits.";

/// Run a command under a distributed lock, and inspect or free locks.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = EXAMPLES)]
struct Cli {
    /// The backend's URL (redis://, rediss://, redis+cluster://, redis+sentinel://,
    /// redlock://, etcd://, etcds://, zk://, zks://, postgres://, mysql://, file:///dir for the
    /// processes of one host); `?client_name=` names this holder.
    #[arg(long, env = "DLOCK_URL", global = true, hide_env_values = true)]
    url: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Take the lock, run CMD while renewing it, release it when CMD exits, exit with CMD's code.
    Run {
        /// The lock key.
        key: String,
        /// The lease length; renewed every ttl/3 while CMD runs.
        #[arg(long, default_value = "30s", value_parser = duration)]
        ttl: Duration,
        /// How long to wait for the lock; 0s: one attempt.
        #[arg(long, default_value = "0s", value_parser = duration)]
        wait: Duration,
        /// The exit code when the lock is busy (CMD does not run).
        #[arg(long, default_value_t = 75)]
        conflict_exit_code: u8,
        /// After a lost lease, how long CMD has between SIGTERM and SIGKILL.
        #[arg(long, default_value = "5s", value_parser = duration)]
        grace: Duration,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Internal: `run`'s watcher, which kills the command's process group
    /// if `dlock` dies (its stdin closes without a word).
    #[command(name = "__reap-group", hide = true)]
    ReapGroup,
    /// Show who holds KEY: holder, time left, fencing token (with --semaphore: the semaphore
    /// KEY's holders, their permits, the count). Exit 0 if held, 1 if free.
    Inspect {
        /// The lock key (the semaphore's name with --semaphore).
        key: String,
        /// KEY names a semaphore.
        #[arg(long)]
        semaphore: bool,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// List held locks, then semaphores with holders (not read-write locks; PostgreSQL cannot
    /// list semaphores: inspect one with --semaphore); exit 0.
    List {
        /// Only keys that start with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// One JSON array on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Free KEY whoever holds it. Exit 0 if a lease was removed, 1 if it was free.
    Release {
        /// Required: a forced release evicts the holder, which learns it at its next renewal.
        #[arg(long, required = true)]
        force: bool,
        /// The lock key.
        key: String,
    },
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration ({e}); write e.g. 30s, 5m, 1h"))
}

// A current-thread runtime: `run` spawns the command from the main thread,
// which lives as long as the process. Linux sends the parent-death signal
// when the *thread* that forked the child ends; a worker thread of a
// multi-thread runtime could end before `dlock` does. (dlock's renewals run
// on its own background thread, whatever runtime the caller has.)
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::ReapGroup = cli.command {
        return ExitCode::from(child::reap_group_when_orphaned());
    }
    let outcome = run(cli).await;
    let code = match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dlock: {}", shown::text(&e.to_string()));
            match e {
                LockError::InvalidKey { .. } | LockError::InvalidOption { .. } => EXIT_USAGE,
                _ => EXIT_UNAVAILABLE,
            }
        }
    };
    // On every exit path: a queue departure or a dropped guard's release
    // handed to dlock's background runtime is done before the process ends.
    dlock::shutdown().await;
    ExitCode::from(code)
}

async fn connect(url: Option<String>) -> Result<Arc<dyn LockBackend>, LockError> {
    let Some(url) = url else {
        return Err(LockError::invalid_option(
            "no backend: pass --url or set DLOCK_URL (e.g. redis://127.0.0.1:6379)",
        ));
    };
    if url.starts_with("memory://") {
        return Err(LockError::invalid_option(
            "memory:// locks live inside one process, so another `dlock` never sees them; use a server (redis://, etcd://, zk://, ...), or file:///dir for the processes of one host",
        ));
    }
    dlock::connect(&url).await
}

async fn run(cli: Cli) -> Result<u8, LockError> {
    // Before anything waits: a signal must not kill `dlock` (the default
    // action) while it holds a queue ticket; one that comes while it
    // connects is answered as soon as the acquisition starts.
    let signals = match cli.command {
        Command::Run { .. } => Some(run::Signals::install()?),
        _ => None,
    };
    let backend = connect(cli.url).await?;
    match cli.command {
        Command::Run {
            key,
            ttl,
            wait,
            conflict_exit_code,
            grace,
            command,
        } => {
            let lock = Lock::new(key).ttl(ttl).wait(wait).with_backend(backend);
            let signals = match signals {
                Some(signals) => signals,
                None => run::Signals::install()?,
            };
            run::run_locked(lock, signals, conflict_exit_code, grace, command).await
        }
        Command::ReapGroup => Err(LockError::invalid_option(
            "__reap-group is dlock's internal watcher, not a command to run",
        )),
        Command::Inspect {
            key,
            semaphore: true,
            json,
        } => {
            // The count given here is not used: `inspect` shows the server's.
            let info = dlock::Semaphore::new(key.clone(), 1)
                .with_backend(backend)
                .inspect()
                .await?;
            if json {
                println!("{}", shown::json(&semaphores::json(&key, &info)));
            } else {
                println!("{}", semaphores::describe(&key, &info));
            }
            Ok(if info.holders.is_empty() { 1 } else { 0 })
        }
        Command::Inspect { key, json, .. } => {
            let info = Lock::new(key.clone())
                .with_backend(backend)
                .inspect()
                .await?;
            match (&info, json) {
                (_, true) => println!("{}", shown::json(&info_json(&key, info.as_ref()))),
                (Some(i), false) => println!("{}", describe(&key, i)),
                (None, false) => println!("{}: free", shown::text(&key)),
            }
            Ok(if info.is_some() { 0 } else { 1 })
        }
        Command::List { prefix, json } => {
            let held = dlock::list_locks(&*backend, &prefix).await?;
            let semaphores = match dlock::list_semaphores(&*backend, &prefix).await {
                Ok(found) => found,
                // A backend without semaphores, or one that cannot list
                // them: the locks are the answer, the reason goes to stderr.
                Err(LockError::InvalidOption { reason }) => {
                    eprintln!("dlock: semaphores not listed: {}", shown::text(&reason));
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            if json {
                let mut items: Vec<_> = held
                    .iter()
                    .map(|(key, i)| info_json(key, Some(i)))
                    .collect();
                items.extend(semaphores.iter().map(|(n, i)| semaphores::json(n, i)));
                println!("{}", shown::json(&serde_json::Value::Array(items)));
            } else {
                for (key, info) in &held {
                    println!("{}", describe(key, info));
                }
                for (name, info) in &semaphores {
                    println!("semaphore {}", semaphores::describe(name, info));
                }
            }
            Ok(0)
        }
        Command::Release { force, key } => {
            debug_assert!(force);
            let freed = Lock::new(key.clone())
                .with_backend(backend)
                .force_release()
                .await?;
            let outcome = if freed { "released" } else { "was free" };
            println!("{}: {outcome}", shown::text(&key));
            Ok(if freed { 0 } else { 1 })
        }
    }
}

/// One held key as JSON (`held: false` when `info` is `None`).
fn info_json(key: &str, info: Option<&LockInfo>) -> serde_json::Value {
    match info {
        Some(i) => serde_json::json!({
            "key": key,
            "kind": "lock",
            "held": true,
            "holder": i.holder,
            "remaining_ms": u64::try_from(i.remaining.as_millis()).unwrap_or(u64::MAX),
            "fencing_token": i.fencing_token,
            "waiting_processes": i.waiting.map_or(0, |w| w.processes),
            "oldest_wait_ms": i.waiting.map(|w| u64::try_from(w.oldest.as_millis()).unwrap_or(u64::MAX)),
        }),
        None => serde_json::json!({ "key": key, "held": false }),
    }
}

/// One held key as a line, the key and the holder's name escaped.
fn describe(key: &str, i: &LockInfo) -> String {
    let remaining =
        Duration::from_millis(u64::try_from(i.remaining.as_millis()).unwrap_or(u64::MAX));
    let waiting = match i.waiting {
        Some(w) => format!(
            "; {} waiting, the oldest for {}",
            match w.processes {
                1 => "1 process".to_owned(),
                n => format!("{n} processes"),
            },
            humantime::format_duration(Duration::from_millis(
                u64::try_from(w.oldest.as_millis()).unwrap_or(u64::MAX)
            ))
        ),
        None => String::new(),
    };
    format!(
        "{}: held by {} for {} more (fencing token {}{waiting})",
        shown::text(key),
        i.holder
            .as_deref()
            .map_or_else(|| "an unnamed holder".to_owned(), shown::text),
        humantime::format_duration(remaining),
        i.fencing_token
            .map_or_else(|| "none".to_owned(), |t| t.to_string())
    )
}

pub(crate) fn io_error(e: std::io::Error) -> LockError {
    LockError::backend("dlock-cli", e)
}
