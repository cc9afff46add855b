//! node-redisson in a Node process, driven line by line (see
//! `tests/foreign/redisson/holder.js`), for the tests of dlock's Redisson
//! layout (`tests/tests/redisson_interop.rs`).
//!
//! node-redisson and its Redis client are installed from the committed
//! lock file by `scripts/install-deps.sh` (`npm ci` in
//! `tests/foreign/redisson`); without them every test here fails with that
//! command named, never skips.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::fixtures::redisson::RedissonFixture;

/// The directory of the Node script and its `node_modules`.
pub fn node_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("foreign/redisson")
}

/// Milliseconds since the epoch now: the clock the Node process prints.
pub fn epoch_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One node-redisson client (one `Redisson` instance) in its own process,
/// killed when dropped.
pub struct NodeRedisson {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl NodeRedisson {
    /// Starts a client of `fixture`'s Redis with node-redisson's
    /// `lockWatchdogTimeout` = `watchdog`, and waits (10 s at most) until
    /// it is connected.
    pub async fn start(fixture: &RedissonFixture, watchdog: Duration) -> NodeRedisson {
        let dir = node_dir();
        assert!(
            dir.join("node_modules/node-redisson").is_dir() && dir.join("node_modules/ioredis").is_dir(),
            "node-redisson is not installed in {}: run scripts/install-deps.sh (or `npm ci` in that directory)",
            dir.display()
        );
        let mode = if fixture.is_cluster() {
            "cluster"
        } else {
            "single"
        };
        let mut child = Command::new("node")
            .current_dir(&dir)
            .arg("holder.js")
            .arg(mode)
            .arg(fixture.hosts())
            .arg(watchdog.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `node`: {e}; run scripts/install-deps.sh (it installs Node.js and node-redisson)")
            });
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut node = NodeRedisson {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        };
        node.expect("READY", Duration::from_secs(10)).await;
        node
    }

    /// Sends one command line (`lock NAME`, `trylock NAME`, `unlock NAME`).
    pub async fn send(&mut self, command: &str) {
        let line = format!("{command}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to node's stdin");
        self.stdin.flush().await.expect("flush node's stdin");
    }

    /// Waits (at most `limit`) for a line starting with `wanted`, and
    /// returns it; panics on `FAILED`, an exit, or the limit.
    pub async fn expect(&mut self, wanted: &str, limit: Duration) -> String {
        let read = async {
            while let Some(line) = self.lines.next_line().await.expect("read node's stdout") {
                if line.starts_with(wanted) {
                    return line;
                }
                assert!(!line.starts_with("FAILED"), "node-redisson: {line}");
            }
            let status = self.child.wait().await;
            panic!("node-redisson exited before printing {wanted} ({status:?})")
        };
        tokio::time::timeout(limit, read)
            .await
            .unwrap_or_else(|_| panic!("node-redisson printed no {wanted} within {limit:?}"))
    }

    /// `lock NAME`, waited for (at most `limit`): the epoch ms it was granted at.
    pub async fn lock(&mut self, name: &str, limit: Duration) -> u64 {
        self.send(&format!("lock {name}")).await;
        self.locked(name, limit).await
    }

    /// Waits for the `LOCKED NAME <ms>` of an earlier `lock`: the epoch ms.
    pub async fn locked(&mut self, name: &str, limit: Duration) -> u64 {
        let line = self.expect(&format!("LOCKED {name} "), limit).await;
        last_number(&line)
    }

    /// `tryLock(0)`: whether it was granted.
    pub async fn try_lock(&mut self, name: &str) -> bool {
        self.send(&format!("trylock {name}")).await;
        let line = self.expect_either(name).await;
        line.starts_with("LOCKED")
    }

    async fn expect_either(&mut self, name: &str) -> String {
        let read = async {
            while let Some(line) = self.lines.next_line().await.expect("read node's stdout") {
                if line.starts_with(&format!("LOCKED {name} ")) || line == format!("BUSY {name}") {
                    return line;
                }
                assert!(!line.starts_with("FAILED"), "node-redisson: {line}");
            }
            panic!("node-redisson exited during tryLock")
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("tryLock answered within 10 s")
    }

    /// `unlock NAME`: the epoch ms just before node-redisson sent it.
    pub async fn unlock(&mut self, name: &str) -> u64 {
        self.send(&format!("unlock {name}")).await;
        let line = self
            .expect(&format!("UNLOCKED {name} "), Duration::from_secs(10))
            .await;
        last_number(&line)
    }

    /// Waits until node-redisson has subscribed to `channel` to wait.
    pub async fn subscribed(&mut self, channel: &str, limit: Duration) {
        self.expect(&format!("SUBSCRIBED {channel}"), limit).await;
    }

    /// `kill -9` of the process: nothing of it runs again, its watchdog
    /// included.
    pub async fn kill_9(&mut self) {
        self.child.start_kill().expect("SIGKILL node");
        let _ = self.child.wait().await;
    }
}

fn last_number(line: &str) -> u64 {
    line.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no epoch ms at the end of {line:?}"))
}
