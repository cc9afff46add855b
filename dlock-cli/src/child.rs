//! `run`'s command as a child process that never outlives the lock holder.
//!
//! - It runs in a process group of its own (its pid is the group's id), so a
//!   signal reaches everything it started: a shell script's children too.
//! - On Linux the kernel sends it SIGKILL if `dlock` dies
//!   (`PR_SET_PDEATHSIG`), whatever killed `dlock`, SIGKILL included.
//! - A watcher process (`dlock` itself, hidden subcommand
//!   [`REAP_SUBCOMMAND`]) holds a pipe from `dlock`: if the pipe closes
//!   without `dlock` saying it is done, `dlock` died, and the watcher sends
//!   SIGKILL to the whole group. That covers the grandchildren, which
//!   `PR_SET_PDEATHSIG` does not, and systems without it.
//!
//! Why SIGKILL when `dlock` dies, not SIGTERM: nothing renews the lease any
//! more, so the key frees at its expiry and the next holder may start; a
//! command that traps or ignores SIGTERM would then run beside it, and
//! nobody is left to enforce a grace period.
//!
//! The environment: `DLOCK_KEY`, `DLOCK_FENCING_TOKEN` (removed when the
//! backend has none), and no `DLOCK_URL`, which may carry credentials.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

use dlock::LockGuard;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The hidden subcommand that runs the watcher.
pub(crate) const REAP_SUBCOMMAND: &str = "__reap-group";

/// What `dlock` writes to the watcher before it exits normally.
const DONE: &[u8] = b"done\n";

/// The command, started under the lock held by `guard`.
pub(crate) struct LockedChild {
    pub(crate) child: tokio::process::Child,
    /// The command's process group (its pid).
    group: Pid,
    /// The watcher, and the pipe it watches.
    watcher: Option<(std::process::Child, std::process::ChildStdin)>,
}

/// Starts `command` in a group of its own, with its parent-death signal
/// set, and its watcher.
///
/// Must be called on the thread that lives as long as the process (the
/// main thread): Linux sends the parent-death signal when the *thread* that
/// forked the child ends, not the process.
pub(crate) fn spawn(command: &[String], guard: &LockGuard) -> std::io::Result<LockedChild> {
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("DLOCK_KEY", guard.key())
        .env_remove("DLOCK_URL")
        .process_group(0);
    match guard.fencing_token() {
        Some(t) => cmd.env("DLOCK_FENCING_TOKEN", t.to_string()),
        None => cmd.env_remove("DLOCK_FENCING_TOKEN"),
    };
    set_parent_death_signal(&mut cmd);
    let child = cmd.spawn()?;
    let group = Pid::from_raw(child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0));
    let watcher = match spawn_watcher(group) {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            eprintln!(
                "dlock: cannot start the watcher that stops the command if dlock dies ({e}); {}",
                if cfg!(target_os = "linux") {
                    "only the command itself is killed then, not what it started"
                } else {
                    "the command would outlive dlock then"
                }
            );
            None
        }
    };
    Ok(LockedChild {
        child,
        group,
        watcher,
    })
}

/// In the child, before `exec`: SIGKILL when `dlock` dies; and if `dlock`
/// died already (before the call), exit instead of running unlocked.
#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut tokio::process::Command) {
    let parent = nix::unistd::getpid();
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before `exec`, where only
    // async-signal-safe calls are allowed: it calls prctl(2) and getppid(2)
    // (plain system calls through `nix`, which allocate nothing) and builds
    // an `io::Error` from a raw errno (no allocation). It takes no lock and
    // touches no state shared with other threads.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // Died between fork and prctl: the child was re-parented and no
            // signal will come.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(Errno::ESRCH as i32));
            }
            Ok(())
        });
    }
}

/// No parent-death signal outside Linux: the watcher alone stops the
/// command if `dlock` dies.
#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut tokio::process::Command) {}

/// `dlock __reap-group <group>`, fed by a pipe only this process holds
/// (close-on-exec: the command does not inherit it).
fn spawn_watcher(group: Pid) -> std::io::Result<(std::process::Child, std::process::ChildStdin)> {
    let exe = std::env::current_exe()?;
    let mut watcher = std::process::Command::new(exe)
        .args([REAP_SUBCOMMAND, &group.as_raw().to_string()])
        .env_remove("DLOCK_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        // Its own group: a Ctrl-C (sent to dlock's group) must not end it.
        .process_group(0)
        .spawn()?;
    let pipe = watcher
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("the watcher has no stdin pipe"))?;
    Ok((watcher, pipe))
}

impl LockedChild {
    /// Sends `sig` to the command's whole process group.
    pub(crate) fn signal(&self, sig: Signal) {
        if self.group.as_raw() > 0 {
            let _ = killpg(self.group, sig);
        }
    }

    /// Whether any process of the command's group is left.
    fn group_alive(&self) -> bool {
        self.group.as_raw() > 0 && killpg(self.group, None) != Err(Errno::ESRCH)
    }

    /// After the command exited: what it left running in its group gets
    /// SIGTERM, and SIGKILL after `grace`, so that nothing it started runs
    /// once the lock is released.
    pub(crate) async fn stop_leftovers(&self, grace: Duration) {
        if !self.group_alive() {
            return;
        }
        eprintln!("dlock: the command left processes running; stopping them before the release");
        self.signal(Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while self.group_alive() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.group_alive() {
            self.signal(Signal::SIGKILL);
        }
    }

    /// SIGTERM to the group, SIGKILL after `grace`; waits for the command.
    pub(crate) async fn stop(&mut self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            self.signal(Signal::SIGKILL);
            let _ = self.child.wait().await;
        }
        self.stop_leftovers(Duration::ZERO).await;
    }

    /// Tells the watcher `dlock` ends normally (it exits without a signal)
    /// and waits for it, briefly.
    pub(crate) async fn finish(mut self) {
        if let Some((mut watcher, mut pipe)) = self.watcher.take() {
            // A watcher gone already answers EPIPE (Rust ignores SIGPIPE).
            let _ = pipe.write_all(DONE);
            drop(pipe);
            for _ in 0..100 {
                if !matches!(watcher.try_wait(), Ok(None)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// The watcher's side: waits until `dlock` writes [`DONE`] or dies (the
/// pipe on stdin closes); if it died, SIGKILL to `group`. Returns the exit
/// code.
pub(crate) fn reap_group_when_orphaned(group: i32) -> u8 {
    use std::io::Read;
    let mut said = Vec::new();
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => said.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
        if said.len() > DONE.len() {
            break;
        }
    }
    if said == DONE || group <= 0 {
        return 0;
    }
    match killpg(Pid::from_raw(group), Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => 0,
        Err(e) => {
            eprintln!("dlock: cannot stop the orphaned command's process group {group}: {e}");
            1
        }
    }
}
