//! Lock holders that are not dlock, for the tests of a waiter that must notice
//! a release nobody announced: redis-py's own `Lock` in a Python process, and
//! raw keys set and deleted with `redis-cli`.
//!
//! redis-py's `Lock.release` is a compare-and-delete script that publishes
//! nothing, like `redis-cli DEL`, `FLUSHALL` or an operator: dlock's release
//! channel stays silent.

pub mod waiting;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// The Python program run by [`PyLock`].
const SCRIPT: &str = include_str!("redis_py_lock.py");

/// The Python program run by [`py_lock_loop`].
const LOOP_SCRIPT: &str = include_str!("redis_py_loop.py");

/// Runs redis-py's `Lock` on `name` (127.0.0.1:`port`) in a loop for
/// `period`, holding each grant for `hold` and writing `start`/`end` marks
/// (token `py`, see [`crate::holder::check_marks`]) to `marks`; returns
/// how many grants it had. Each try is redis-py's default blocking acquire:
/// a `SET NX PX` every 0.1 s, no queue.
pub async fn py_lock_loop(
    name: &str,
    port: u16,
    hold: Duration,
    period: Duration,
    marks: &std::path::Path,
) -> usize {
    let python = python();
    let run = Command::new(&python)
        .arg("-c")
        .arg(LOOP_SCRIPT)
        .arg(name)
        .arg(port.to_string())
        .arg(hold.as_secs_f64().to_string())
        .arg(period.as_secs_f64().to_string())
        .arg(marks)
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(period + Duration::from_secs(30), run)
        .await
        .expect("the redis-py loop ends within its period and 30 s")
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {}: {e}; run scripts/install-deps.sh (it installs the `redis` \
                 Python package) or set DLOCK_PYTHON",
                python.display()
            )
        });
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("GRANTS "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "the redis-py loop printed no GRANTS line: {text:?} ({:?})",
                out.status
            )
        })
}

/// The Python program run by [`py_blocking_locks`].
const BLOCKING_SCRIPT: &str = include_str!("redis_py_blocking.py");

/// What [`py_blocking_locks`] saw: how long each granted acquire waited,
/// and the names whose wait ran out.
#[derive(Debug, Default)]
pub struct PyBlocking {
    /// How long each granted acquire waited, in the order of `names`.
    pub waited: Vec<Duration>,
    /// The names whose blocking acquire ran out of its `wait`.
    pub refused: Vec<String>,
}

/// Takes redis-py's blocking `Lock` (ttl 10 s) on each of `names` in turn
/// (127.0.0.1:`port`), each acquire waiting at most `wait` (a `SET NX PX`
/// every 0.1 s), held for `hold`, then released.
pub async fn py_blocking_locks(
    port: u16,
    wait: Duration,
    hold: Duration,
    names: &[String],
) -> PyBlocking {
    let python = python();
    let run = Command::new(&python)
        .arg("-c")
        .arg(BLOCKING_SCRIPT)
        .arg(port.to_string())
        .arg(wait.as_secs_f64().to_string())
        .arg(hold.as_secs_f64().to_string())
        .args(names)
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let bound =
        (wait + hold) * u32::try_from(names.len()).unwrap_or(u32::MAX) + Duration::from_secs(30);
    let out = tokio::time::timeout(bound, run)
        .await
        .expect("the redis-py blocking locks end within their waits and 30 s")
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {}: {e}; run scripts/install-deps.sh (it installs the `redis` \
                 Python package) or set DLOCK_PYTHON",
                python.display()
            )
        });
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("GRANTS ")),
        "the redis-py blocking locks printed no GRANTS line: {text:?} ({:?})",
        out.status
    );
    let mut seen = PyBlocking::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("WAITED ") {
            let secs: f64 = rest
                .rsplit(' ')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("a WAITED line ends with seconds: {line:?}"));
            seen.waited.push(Duration::from_secs_f64(secs));
        } else if let Some(name) = line.strip_prefix("REFUSED ") {
            seen.refused.push(name.to_owned());
        }
    }
    seen
}

/// The Python interpreter with the `redis` package: `$DLOCK_PYTHON` if set,
/// else the virtualenv `scripts/install-deps.sh` makes where the system's
/// Python refuses `pip install` (PEP 668), else `python3`.
pub fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("DLOCK_PYTHON") {
        return PathBuf::from(python);
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")));
    if let Some(venv) = data.map(|d| d.join("dlock/python/bin/python3")) {
        if venv.exists() {
            return venv;
        }
    }
    PathBuf::from("python3")
}

/// A redis-py `Lock` held on one or more servers by a Python process, killed
/// when dropped.
pub struct PyLock {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl PyLock {
    /// Starts a Python process that takes `r.lock(name, timeout=timeout)` on
    /// the server at each of `ports` (127.0.0.1), holds for `hold`, then
    /// releases with `Lock.release`.
    pub fn spawn(name: &str, timeout: Duration, hold: Duration, ports: &[u16]) -> PyLock {
        let python = python();
        let mut command = Command::new(&python);
        command
            .arg("-c")
            .arg(SCRIPT)
            .arg(name)
            .arg(timeout.as_secs_f64().to_string())
            .arg(hold.as_secs_f64().to_string())
            .args(ports.iter().map(u16::to_string));
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; run scripts/install-deps.sh (it installs the `redis` \
                     Python package) or set DLOCK_PYTHON",
                    python.display()
                )
            });
        let stdout = child.stdout.take().expect("stdout is piped");
        PyLock {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Waits (at most `limit`) for the line `HELD`.
    pub async fn held(&mut self, limit: Duration) {
        self.line("HELD", limit).await;
    }

    /// Waits (at most `limit`) for the line `RELEASED`; returns when it was
    /// read, just after `Lock.release` returned in the Python process.
    pub async fn released(&mut self, limit: Duration) -> Instant {
        self.line("RELEASED", limit).await;
        Instant::now()
    }

    async fn line(&mut self, wanted: &str, limit: Duration) {
        let read = async {
            while let Some(line) = self.lines.next_line().await.expect("read python stdout") {
                if line == wanted {
                    return;
                }
                assert!(!line.starts_with("FAILED"), "redis-py holder: {line}");
            }
            let status = self.child.wait().await;
            panic!(
                "the redis-py holder exited before printing {wanted} ({status:?}); \
                 is the `redis` Python package installed? run scripts/install-deps.sh"
            );
        };
        tokio::time::timeout(limit, read).await.unwrap_or_else(|_| {
            panic!("the redis-py holder did not print {wanted} within {limit:?}")
        });
    }
}
