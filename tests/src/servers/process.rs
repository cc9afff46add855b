//! One server process: spawn, readiness wait, signals, restart, and cleanup on drop.
//!
//! Every server kind in the harness (Redis, etcd, ZooKeeper) is a child process that logs to a
//! file in its temp dir. This type owns that child: it can stop it (SIGTERM, then SIGKILL after
//! [`STOP_GRACE`]), kill it hard, pause and resume it (SIGSTOP / SIGCONT), and start it again
//! with the very same command line, so a restarted server comes back on the same port with
//! the same data dir. Dropping it stops the child; drop never panics and never waits longer
//! than the grace period plus the reaping of a SIGKILLed process.
//!
//! The API is synchronous on purpose: the calls are short (a probe every 20 ms, bounded), work
//! from `Drop`, and can be made from `#[tokio::test]` code without any runtime plumbing.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::{Context, HarnessError, HarnessResult};

/// How long `stop` waits after SIGTERM before it sends SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often readiness probes and exit checks run.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// Lines of the server log quoted in error messages.
const LOG_TAIL_LINES: usize = 40;

/// Where to find a binary, or the message that says how to install it.
///
/// `what_to_install` is the Debian package list (e.g. `"redis-server redis-tools"`). A missing
/// server is a failed test with this message, never a silent skip.
pub fn require_binary(name: &str, what_to_install: &str) -> HarnessResult<PathBuf> {
    find_in_path(name).ok_or_else(|| missing(name, what_to_install))
}

/// Whether `path` exists, or the message that says how to install the package that ships it.
pub fn require_file(path: &Path, what_to_install: &str) -> HarnessResult<PathBuf> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(missing(&path.display().to_string(), what_to_install))
    }
}

fn missing(name: &str, what_to_install: &str) -> HarnessError {
    HarnessError::new(format!(
        "{name} not found: run `sudo apt-get install {what_to_install}` or `scripts/install-deps.sh`"
    ))
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The command line of a server process: program, arguments, environment, log file.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
    log_path: PathBuf,
}

impl ProcessSpec {
    /// A spec for `program`, named `name` in messages, logging stdout and stderr to `log_path`
    /// (appended to, so the log of a restarted server keeps its earlier runs).
    pub fn new(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        log_path: impl Into<PathBuf>,
    ) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
            cwd: None,
            log_path: log_path.into(),
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Appends several arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Sets one environment variable for the child.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Sets the working directory of the child.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// The log file the child writes to.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

/// A running (or stopped, restartable) server process, stopped on drop.
#[derive(Debug)]
pub struct ServerProcess {
    spec: ProcessSpec,
    child: Option<Child>,
    paused: bool,
}

impl ServerProcess {
    /// Spawns the child described by `spec`, stdin from `/dev/null`, stdout and stderr
    /// appended to the spec's log file. Does not wait for readiness: see [`Self::wait_until`].
    pub fn spawn(spec: ProcessSpec) -> HarnessResult<Self> {
        let mut process = Self {
            spec,
            child: None,
            paused: false,
        };
        process.start()?;
        Ok(process)
    }

    /// The name used in messages (e.g. `redis 127.0.0.1:23456`).
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The OS process id, or `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child is alive (a paused child counts as running).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Whether the child is stopped with SIGSTOP by [`Self::pause`].
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The log file of the child.
    pub fn log_path(&self) -> &Path {
        &self.spec.log_path
    }

    /// Starts the child again with the same command line (same port, same data dir). Fails if
    /// it is still running. Does not wait for readiness.
    pub fn start(&mut self) -> HarnessResult<()> {
        if self.is_running() {
            return Err(HarnessError::new(format!(
                "{} is already running (pid {:?})",
                self.spec.name,
                self.pid()
            )));
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log_path)
            .context(|| format!("open log {}", self.spec.log_path.display()))?;
        let log_err = log
            .try_clone()
            .context(|| format!("clone log handle {}", self.spec.log_path.display()))?;
        let mut command = Command::new(&self.spec.program);
        command
            .args(&self.spec.args)
            .envs(self.spec.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        if let Some(dir) = &self.spec.cwd {
            command.current_dir(dir);
        }
        let child = command
            .spawn()
            .context(|| format!("spawn {} ({})", self.spec.name, self.spec.program.display()))?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    /// Stops the child: SIGTERM (plus SIGCONT if it was paused), then SIGKILL if it has not
    /// exited after [`STOP_GRACE`]; the child is reaped, so its ports are closed on return.
    /// Stopping a stopped process does nothing.
    pub fn stop(&mut self) -> HarnessResult<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            self.paused = false;
            return Ok(());
        }
        let pid = pid_of(&child);
        let _ = kill(pid, Signal::SIGTERM);
        if self.paused {
            let _ = kill(pid, Signal::SIGCONT);
            self.paused = false;
        }
        if wait_for_exit(&mut child, STOP_GRACE).is_some() {
            return Ok(());
        }
        let _ = child.kill();
        child
            .wait()
            .map(|_| ())
            .context(|| format!("reap {} after SIGKILL", self.spec.name))
    }

    /// Kills the child with SIGKILL (a crash: no shutdown work) and reaps it.
    pub fn kill9(&mut self) -> HarnessResult<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        self.paused = false;
        let _ = child.kill();
        child
            .wait()
            .map(|_| ())
            .context(|| format!("reap {} after SIGKILL", self.spec.name))
    }

    /// Freezes the child with SIGSTOP: its sockets stay open but nothing is answered, like a
    /// long GC pause or a hung host.
    ///
    /// SIGSTOP is delivered asynchronously, so this waits (up to 2 s) until every thread of
    /// the process is in the stopped state; a request sent after `pause` returns is never
    /// answered by a thread that had not stopped yet.
    pub fn pause(&mut self) -> HarnessResult<()> {
        self.signal(Signal::SIGSTOP)?;
        self.paused = true;
        let pid = self.pid().unwrap_or_default();
        let started = Instant::now();
        while !all_threads_stopped(pid) {
            if started.elapsed() > Duration::from_secs(2) {
                return Err(HarnessError::new(format!(
                    "{} did not stop within 2 s of SIGSTOP",
                    self.spec.name
                )));
            }
            thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Lets a paused child go on with SIGCONT.
    pub fn resume(&mut self) -> HarnessResult<()> {
        self.signal(Signal::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    fn signal(&mut self, signal: Signal) -> HarnessResult<()> {
        let child = self
            .child
            .as_ref()
            .ok_or_else(|| HarnessError::new(format!("{} is not running", self.spec.name)))?;
        kill(pid_of(child), signal).context(|| format!("send {signal} to {}", self.spec.name))
    }

    /// Probes every [`PROBE_INTERVAL`] until `probe` returns true, for at most `limit`.
    ///
    /// Fails early if the child exits, and on timeout; both errors quote the end of the log.
    pub fn wait_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut probe: impl FnMut() -> bool,
    ) -> HarnessResult<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return Err(HarnessError::new(format!(
                    "{} exited ({status}) before {what}; log {}:\n{}",
                    self.spec.name,
                    self.spec.log_path.display(),
                    self.log_tail()
                )));
            }
            if self.child.is_none() {
                return Err(HarnessError::new(format!(
                    "{} is not running, so it cannot become {what}",
                    self.spec.name
                )));
            }
            if probe() {
                return Ok(());
            }
            if started.elapsed() >= limit {
                return Err(HarnessError::new(format!(
                    "{} not {what} after {limit:?}; log {}:\n{}",
                    self.spec.name,
                    self.spec.log_path.display(),
                    self.log_tail()
                )));
            }
            thread::sleep(PROBE_INTERVAL);
        }
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// The last lines of the log file (for error messages).
    pub fn log_tail(&self) -> String {
        log_tail(&self.spec.log_path, LOG_TAIL_LINES)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Freezes `pid` with SIGSTOP and waits (up to 2 s) until every thread of
/// it stopped. Panics if it cannot.
#[track_caller]
pub fn freeze(pid: u32) {
    let raw = Pid::from_raw(i32::try_from(pid).expect("a pid fits in i32"));
    kill(raw, Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP {pid}: {e}"));
    let started = Instant::now();
    while !all_threads_stopped(pid) {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "not stopped in 2 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of `pid` is stopped (state `T` in `/proc/PID/task/*/stat`).
pub fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread exited meanwhile
        };
        // Format: `TID (COMM) STATE ...`; COMM may contain spaces and parentheses.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        if !matches!(state, Some("T" | "t")) {
            return false;
        }
        any = true;
    }
    any
}

fn pid_of(child: &Child) -> Pid {
    // Linux pids fit in i32 (pid_max <= 2^22).
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

fn wait_for_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if started.elapsed() < limit => thread::sleep(PROBE_INTERVAL),
            _ => return None,
        }
    }
}

/// The last `lines` lines of a log file (at most its last 64 KiB are read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What a finished helper command (e.g. `redis-cli`, `etcdctl`) printed.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    /// Exit status; `None` when it was killed for running past its time limit.
    pub status: Option<ExitStatus>,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
}

impl CommandOutput {
    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The trimmed stdout of a `run` that succeeded; panics otherwise, with
    /// `what` ran (e.g. `redis-cli ["PING"] against 127.0.0.1:6379`), how it
    /// ended and all it printed.
    #[track_caller]
    pub fn trimmed_stdout(run: HarnessResult<CommandOutput>, what: fmt::Arguments<'_>) -> String {
        match run {
            Ok(out) if out.success() => out.stdout.trim().to_string(),
            Ok(out) => panic!(
                "{what} failed ({}): {}{}",
                out.status
                    .map_or_else(|| "timed out".to_string(), |s| s.to_string()),
                out.stdout,
                out.stderr
            ),
            Err(e) => panic!("{e}"),
        }
    }
}

/// Runs a helper command to completion, killing it after `limit` (a CLI talking to a paused
/// server would otherwise hang the test forever).
pub fn run_command(
    program: &Path,
    args: &[OsString],
    envs: &[(OsString, OsString)],
    limit: Duration,
) -> HarnessResult<CommandOutput> {
    let mut child = Command::new(program)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context(|| format!("run {}", program.display()))?;
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    let status = wait_for_exit(&mut child, limit);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(CommandOutput {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

fn read_in_background(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
