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
//! The watcher starts first, and the command tells it its group itself,
//! between `fork` and `exec`: so there is no moment when the command runs
//! and a `dlock` killed would leave its children unwatched. (Started the
//! other way round, a `kill -9` that came while the watcher was being
//! started left the command's children running.)
//!
//! Why SIGKILL when `dlock` dies, not SIGTERM: nothing renews the lease any
//! more, so the key frees at its expiry and the next holder may start; a
//! command that traps or ignores SIGTERM would then run beside it, and
//! nobody is left to enforce a grace period.
//!
//! The environment: `DLOCK_KEY`, `DLOCK_FENCING_TOKEN` (removed when the
//! backend has none), and no `DLOCK_URL`, which may carry credentials.

use std::io::Write;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
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

/// What the command writes to the watcher before `exec`: `group <pid>`.
const GROUP: &[u8] = b"group ";

/// The most the watcher reads: a group line and [`DONE`] are far shorter.
const MAX_TOLD: usize = 256;

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
    let watcher = match spawn_watcher() {
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
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("DLOCK_KEY", guard.key())
        .env_remove("DLOCK_URL")
        .process_group(0);
    match guard.fencing_token() {
        Some(t) => cmd.env("DLOCK_FENCING_TOKEN", t.to_string()),
        None => cmd.env_remove("DLOCK_FENCING_TOKEN"),
    };
    arm_before_exec(&mut cmd, watcher.as_ref().map(|(_, pipe)| pipe.as_raw_fd()));
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            // Nothing to watch: the watcher is told so and exits.
            if let Some((_, mut pipe)) = watcher {
                let _ = pipe.write_all(DONE);
            }
            return Err(e);
        }
    };
    let group = Pid::from_raw(child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0));
    Ok(LockedChild {
        child,
        group,
        watcher,
    })
}

/// In the child, before `exec`:
/// - on Linux, SIGKILL when `dlock` dies;
/// - the watcher is told the child's group (its pid), so that from here on
///   a `dlock` that dies has the whole group killed;
/// - if `dlock` died already, exit instead of running unlocked (Linux: it
///   died before the parent-death signal was set, and no signal will come).
fn arm_before_exec(cmd: &mut tokio::process::Command, watcher: Option<RawFd>) {
    let parent = nix::unistd::getpid();
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before `exec`, where only
    // async-signal-safe calls are allowed: prctl(2), getpid(2), getppid(2),
    // sigaction(2) and write(2) (plain system calls through `nix`, which
    // allocate nothing); the group line is formatted into a stack buffer,
    // and an error is an `io::Error` built from a raw errno (no allocation).
    // It takes no lock and touches no state shared with other threads. `fd`
    // is the watcher's pipe: `dlock` keeps it open until after the spawn, and
    // the child holds its copy until `exec` (close-on-exec).
    unsafe {
        cmd.pre_exec(move || {
            #[cfg(target_os = "linux")]
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if let Some(fd) = watcher {
                tell_group(BorrowedFd::borrow_raw(fd), nix::unistd::getpid().as_raw());
            }
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(Errno::ESRCH as i32));
            }
            Ok(())
        });
    }
}

/// Writes `group <pid>` to the watcher. A watcher gone (EPIPE) must not
/// kill the child with SIGPIPE (the default action again in the child):
/// the command then runs with its parent-death signal alone, as when the
/// watcher could not start.
///
/// # Safety
/// Only for the child between `fork` and `exec`, single-threaded: it
/// changes the process's SIGPIPE disposition for the write, then sets the
/// default back.
#[allow(unsafe_code)]
unsafe fn tell_group(pipe: BorrowedFd<'_>, pid: i32) {
    use nix::sys::signal::{signal, SigHandler};
    let mut line = [0u8; 24];
    let line = group_line(pid, &mut line);
    // SAFETY: sigaction(2) is async-signal-safe, and nothing else runs in
    // the child to see the disposition change.
    let ignored = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
    // One write: at most PIPE_BUF bytes reach a pipe whole.
    while nix::unistd::write(pipe, line) == Err(Errno::EINTR) {}
    if ignored.is_ok() {
        // SAFETY: as above.
        let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    }
}

/// `group <pid>\n` in `buf`, without allocating (it runs before `exec`):
/// formatting an integer into a slice is plain code on the stack.
fn group_line(pid: i32, buf: &mut [u8; 24]) -> &[u8] {
    let capacity = buf.len();
    let mut rest = &mut buf[..];
    // 6 + at most 11 + 1 bytes: always fits.
    let _ = rest.write_all(GROUP).and_then(|()| writeln!(rest, "{pid}"));
    let len = capacity - rest.len();
    &buf[..len]
}

/// `dlock __reap-group`, fed by a pipe that only this process and the
/// command (until its `exec`: close-on-exec) hold.
fn spawn_watcher() -> std::io::Result<(std::process::Child, std::process::ChildStdin)> {
    let exe = std::env::current_exe()?;
    let mut watcher = std::process::Command::new(exe)
        .arg(REAP_SUBCOMMAND)
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
/// pipe on stdin closes); if it died, SIGKILL to the group the command told
/// (none told: `dlock` died before the command started). Returns the exit
/// code.
pub(crate) fn reap_group_when_orphaned() -> u8 {
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
        if said.len() > MAX_TOLD || told(&said).done {
            break;
        }
    }
    let told = told(&said);
    let Some(group) = told.group.filter(|_| !told.done) else {
        return 0;
    };
    match killpg(Pid::from_raw(group), Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => 0,
        Err(e) => {
            eprintln!("dlock: cannot stop the orphaned command's process group {group}: {e}");
            1
        }
    }
}

/// What the watcher was told: the command's group, and whether `dlock`
/// said it is done.
#[derive(Debug, PartialEq)]
struct Told {
    group: Option<i32>,
    done: bool,
}

/// Reads the whole lines of `said`. A group that is not a positive pid is
/// ignored: `killpg` of 0 or less would reach other groups.
fn told(said: &[u8]) -> Told {
    let mut told = Told {
        group: None,
        done: false,
    };
    let whole = said
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(&said[..0], |end| &said[..=end]);
    for line in whole.split_inclusive(|&b| b == b'\n') {
        if line == DONE {
            told.done = true;
        } else if let Some(pid) = line
            .strip_prefix(GROUP)
            .and_then(|rest| std::str::from_utf8(rest).ok())
            .and_then(|rest| rest.trim_end().parse::<i32>().ok())
            .filter(|&pid| pid > 0)
        {
            told.group = Some(pid);
        }
    }
    told
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_line_is_the_pid_in_decimal() {
        let mut buf = [0u8; 24];
        for pid in [1, 9, 10, 4_194_304, i32::MAX] {
            assert_eq!(
                group_line(pid, &mut buf),
                format!("group {pid}\n").as_bytes()
            );
        }
    }

    #[test]
    fn the_watcher_reads_the_group_and_done() {
        let told_group = |group| Told {
            group: Some(group),
            done: false,
        };
        assert_eq!(told(b"group 42\n"), told_group(42));
        assert_eq!(
            told(b"group 42\ndone\n"),
            Told {
                group: Some(42),
                done: true
            }
        );
        // dlock died before the command started: nothing to kill.
        assert_eq!(
            told(b""),
            Told {
                group: None,
                done: false
            }
        );
        // A half-written line counts for nothing; nor do 0, negatives and
        // noise.
        for said in [
            &b"group 4"[..],
            b"group 0\n",
            b"group -1\n",
            b"group x\n",
            b"done",
        ] {
            assert_eq!(told(said).group, None, "{said:?}");
            assert!(!told(said).done, "{said:?}");
        }
        assert_eq!(told(b"group 7\ndon"), told_group(7));
    }
}
