//! `dlock run`: wait for the lock (or a signal), run the command under it,
//! watch the command, the lease and our own signals.

use std::time::Duration;

use dlock::{Lock, LockError};
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, Signal as Stream, SignalKind};

use crate::child;
use crate::{io_error, EXIT_LOST};

/// SIGINT and SIGTERM, caught from before the acquisition starts: a waiter
/// that is interrupted leaves its queue before `dlock` exits.
pub(crate) struct Signals {
    interrupts: Stream,
    terminates: Stream,
}

impl Signals {
    pub(crate) fn install() -> Result<Self, LockError> {
        Ok(Signals {
            interrupts: signal(SignalKind::interrupt()).map_err(io_error)?,
            terminates: signal(SignalKind::terminate()).map_err(io_error)?,
        })
    }

    /// The next SIGINT or SIGTERM.
    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupts.recv() => Signal::SIGINT,
            _ = self.terminates.recv() => Signal::SIGTERM,
        }
    }
}

/// The exit code for "ended by signal `sig`": 128 + its number.
fn signal_exit(sig: Signal) -> u8 {
    u8::try_from(128 + sig as i32).unwrap_or(255)
}

/// `run`: take, spawn, watch the child, the lease and our own signals.
pub(crate) async fn run_locked(
    lock: Lock,
    mut signals: Signals,
    conflict: u8,
    grace: Duration,
    command: Vec<String>,
) -> Result<u8, LockError> {
    // Printed escaped, as every text `dlock` prints.
    let key = crate::shown::text(lock.key());
    // A signal while waiting drops the acquisition, which leaves the queue
    // (in the background; `main`'s `dlock::shutdown` waits for it).
    let acquired = tokio::select! {
        acquired = lock.acquire() => acquired,
        sig = signals.next() => {
            eprintln!("dlock: {sig} while waiting for `{key}`; not running the command");
            return Ok(signal_exit(sig));
        }
    };
    let guard = match acquired {
        Ok(guard) => guard,
        Err(LockError::Busy { .. }) | Err(LockError::Timeout { .. }) => {
            // Who holds it, as `dlock inspect` shows it (escaped): the
            // operator's next question. Best effort: the key may have been
            // freed since, or the backend may not say.
            let holder = match lock.inspect().await {
                Ok(Some(info)) => info
                    .holder
                    .as_deref()
                    .map_or_else(|| "an unnamed holder".to_owned(), crate::shown::text),
                _ => "another holder".to_owned(),
            };
            eprintln!("dlock: `{key}` is held by {holder}; not running the command");
            return Ok(conflict);
        }
        Err(e) => return Err(e),
    };
    let mut child = match child::spawn(&command, &guard) {
        Ok(child) => child,
        Err(e) => {
            let program = crate::shown::text(&command[0]);
            eprintln!("dlock: cannot run `{program}`: {e}");
            let _ = guard.release().await;
            return Ok(127);
        }
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            status = child.child.wait() => break status.map_err(io_error),
            sig = signals.next() => child.signal(sig),
            _ = &mut lost => {
                eprintln!("dlock: the lease on `{key}` was lost; stopping the command");
                child.stop(grace).await;
                child.finish().await;
                return Ok(EXIT_LOST);
            }
        }
    };
    // Nothing the command started runs once the lock is released.
    child.stop_leftovers(grace).await;
    if let Err(e) = guard.release().await {
        let e = crate::shown::text(&e.to_string());
        eprintln!("dlock: releasing the lock: {e}");
    }
    child.finish().await;
    Ok(exit_code(&status?))
}

/// The command's exit code, 128 + N if signal N ended it.
fn exit_code(status: &std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        _ => 1,
    }
}
