//! Runs the `lock-holder`, `permit-holder` and `reader-holder` binaries as
//! separate OS processes, for cross-process and crash tests.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// A `lock-holder` child process; killed when dropped.
pub struct Holder {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

/// What a holder run does: `cycles` times acquire, hold for `hold`, release.
#[derive(Debug, Clone)]
pub struct HolderSpec {
    /// The backend URL.
    pub url: String,
    /// The lock key.
    pub key: String,
    /// The lease ttl.
    pub ttl: Duration,
    /// How long each critical section lasts.
    pub hold: Duration,
    /// How many critical sections.
    pub cycles: u32,
    /// A file to append `start <pid> <token>` / `end <pid> <token>` marks to.
    pub marks: Option<std::path::PathBuf>,
}

impl HolderSpec {
    /// One critical section on `key`, held for `hold` (a crash test kills
    /// the holder in it), with no marks file.
    pub fn once(url: &str, key: &str, ttl: Duration, hold: Duration) -> HolderSpec {
        HolderSpec {
            url: url.to_owned(),
            key: key.to_owned(),
            ttl,
            hold,
            cycles: 1,
            marks: None,
        }
    }
}

impl Holder {
    /// Starts `binary` (pass `env!("CARGO_BIN_EXE_lock-holder")` from a test).
    pub fn spawn(binary: &str, spec: &HolderSpec) -> Holder {
        let mut args = vec![
            spec.url.clone(),
            spec.key.clone(),
            spec.ttl.as_millis().to_string(),
            spec.hold.as_millis().to_string(),
            spec.cycles.to_string(),
        ];
        if let Some(marks) = &spec.marks {
            args.push(marks.display().to_string());
        }
        Holder::spawn_args(binary, &args)
    }

    /// Starts the `permit-holder` binary (pass
    /// `env!("CARGO_BIN_EXE_permit-holder")`): it takes one permit of the
    /// semaphore `name` with `permits` permits and holds it for `hold`.
    pub fn spawn_permit(
        binary: &str,
        url: &str,
        name: &str,
        permits: usize,
        ttl: Duration,
        hold: Duration,
    ) -> Holder {
        let args = [
            url.to_owned(),
            name.to_owned(),
            permits.to_string(),
            ttl.as_millis().to_string(),
            hold.as_millis().to_string(),
        ];
        Holder::spawn_args(binary, &args)
    }

    /// Starts the `reader-holder` binary (pass
    /// `env!("CARGO_BIN_EXE_reader-holder")`): it takes a read lease of the
    /// read-write lock on `key` and holds it for `hold`.
    pub fn spawn_reader(
        binary: &str,
        url: &str,
        key: &str,
        ttl: Duration,
        hold: Duration,
    ) -> Holder {
        let args = [
            url.to_owned(),
            key.to_owned(),
            ttl.as_millis().to_string(),
            hold.as_millis().to_string(),
        ];
        Holder::spawn_args(binary, &args)
    }

    fn spawn_args(binary: &str, args: &[String]) -> Holder {
        let (child, stdout) = spawn_piped(binary, args);
        Holder {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Waits (at most `limit`) for the next `ACQUIRED <token>` line; returns
    /// the token text (a fencing token, or a permit's owner token).
    pub async fn acquired(&mut self, limit: Duration) -> String {
        let read = async {
            while let Some(line) = self.lines.next_line().await.expect("read holder stdout") {
                if let Some(token) = line.strip_prefix("ACQUIRED ") {
                    return token.to_owned();
                }
            }
            panic!("the holder exited without acquiring");
        };
        tokio::time::timeout(limit, read)
            .await
            .unwrap_or_else(|_| panic!("the holder did not acquire within {limit:?}"))
    }

    /// The OS process id, while it runs (to pause it with SIGSTOP).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits (at most `limit`) for the process to exit and returns whether
    /// it succeeded (a holder whose lease was lost fails its release).
    pub async fn exit_success(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the holder did not exit within {limit:?}"))
            .expect("wait for the holder")
            .success()
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    pub async fn kill9(&mut self) {
        self.child.start_kill().expect("SIGKILL the holder");
        let _ = self.child.wait().await;
    }

    /// Waits (at most `limit`) for the process to exit; panics on failure or timeout.
    pub async fn finish(&mut self, limit: Duration) {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the holder did not finish within {limit:?}"))
            .expect("wait for the holder");
        assert!(status.success(), "the holder failed: {status}");
    }
}

/// Starts `binary` with `args`, its stdout piped to the test and its
/// stderr inherited; killed when the returned child is dropped.
pub(crate) fn spawn_piped(binary: &str, args: &[String]) -> (Child, ChildStdout) {
    let mut child = Command::new(binary)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let stdout = child.stdout.take().expect("stdout is piped");
    (child, stdout)
}

/// Checks a marks file written by holders: critical sections never
/// interleave, and fencing tokens strictly increase from one to the next.
/// Returns how many critical sections it saw.
pub fn check_marks(text: &str) -> usize {
    let mut open: Option<(&str, &str)> = None;
    let mut last_token: Option<u64> = None;
    let mut sections = 0;
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [what, pid, token] = parts[..] else {
            panic!("malformed mark line {line:?}");
        };
        match what {
            "start" => {
                assert!(
                    open.is_none(),
                    "overlap: {pid} started while {open:?} held the lock"
                );
                if let Ok(t) = token.parse::<u64>() {
                    if let Some(prev) = last_token {
                        assert!(t > prev, "fencing token {t} after {prev}");
                    }
                    last_token = Some(t);
                }
                open = Some((pid, token));
            }
            "end" => {
                assert_eq!(
                    open,
                    Some((pid, token)),
                    "end of a section that was not open"
                );
                open = None;
                sections += 1;
            }
            other => panic!("unknown mark {other:?}"),
        }
    }
    sections
}
