//! Apache Curator in a JVM, the other side of the ZooKeeper interop tests:
//! small Java programs (`curator/*.java`) compiled once per test binary
//! against Debian's Curator jars, run as child processes that answer on
//! stdout, and killed when dropped.
//!
//! - `CuratorLock`: an `InterProcessMutex` held for a while, or tried for
//!   a while ([`Curator::mutex`]).
//! - `CuratorRwLock`: named holders of an `InterProcessReadWriteLock`,
//!   each on its own thread, driven by commands on stdin
//!   ([`Curator::read_write`], [`Curator::send`], [`Curator::answer`]).
//! - `CuratorLeaderLatch`: a `LeaderLatch` with an id, driven by commands
//!   on stdin ([`Curator::leader_latch`], [`Curator::send`],
//!   [`Curator::line`]).
//! - `CuratorDoubleBarrier`: one member of a `DistributedDoubleBarrier`,
//!   driven by commands on stdin ([`Curator::double_barrier`],
//!   [`Curator::send`], [`Curator::line`]).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The Java programs, by file name.
const PROGRAMS: &[(&str, &str)] = &[
    ("CuratorLock.java", include_str!("curator/CuratorLock.java")),
    (
        "CuratorRwLock.java",
        include_str!("curator/CuratorRwLock.java"),
    ),
    (
        "CuratorLeaderLatch.java",
        include_str!("curator/CuratorLeaderLatch.java"),
    ),
    (
        "CuratorDoubleBarrier.java",
        include_str!("curator/CuratorDoubleBarrier.java"),
    ),
];

/// Jars of Debian's `libcurator-*-java` and `zookeeper` packages.
const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "guava.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
];

/// Compiles the Java programs once per test binary; returns the class path.
pub fn classpath() -> String {
    static COMPILED: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    let (_, cp) = COMPILED.get_or_init(|| {
        let jars: Vec<PathBuf> = JARS
            .iter()
            .map(|j| Path::new("/usr/share/java").join(j))
            .collect();
        for jar in &jars {
            assert!(
                jar.exists(),
                "{} is missing: install Debian's libcurator-recipes-java, libcurator-framework-java, \
                 libcurator-client-java, zookeeper and libslf4j-java",
                jar.display()
            );
        }
        let dir = tempfile::tempdir().expect("temp dir for the Java programs");
        for (name, source) in PROGRAMS {
            std::fs::write(dir.path().join(name), source).unwrap();
        }
        let jar_cp = jars
            .iter()
            .map(|j| j.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        let out = std::process::Command::new("javac")
            .arg("-cp")
            .arg(&jar_cp)
            .arg("-d")
            .arg(dir.path())
            .args(PROGRAMS.iter().map(|(name, _)| dir.path().join(name)))
            .output()
            .expect("run javac (Debian package default-jdk-headless)");
        assert!(
            out.status.success(),
            "javac failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cp = format!("{}:{jar_cp}", dir.path().display());
        (dir, cp)
    });
    cp.clone()
}

/// A running Curator program and its stdout lines; killed when dropped.
pub struct Curator {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    /// Lines read while looking for another holder's answer.
    unclaimed: VecDeque<String>,
}

impl Curator {
    /// `CuratorLock <connect> <path> <mode> <ms>`: an `InterProcessMutex`
    /// on `path`; mode `hold` takes it and holds it for `ms`, mode `try`
    /// waits at most `ms` for it (and releases it at once). It prints
    /// `ACQUIRED` or `TIMEOUT`, then `RELEASED` after a release.
    pub fn mutex(connect: &str, path: &str, mode: &str, ms: u64) -> Self {
        let ms = ms.to_string();
        Self::spawn(&["CuratorLock", connect, path, mode, &ms], false)
    }

    /// `CuratorRwLock <connect> <path>`: holders of an
    /// `InterProcessReadWriteLock` on `path`, driven by [`send`](Self::send)
    /// (`"<holder> read <ms>"`, `"<holder> write <ms>"`,
    /// `"<holder> release"`) and answering per holder
    /// ([`answer`](Self::answer)). Returns once the client is connected.
    pub async fn read_write(connect: &str, path: &str, startup: Duration) -> Self {
        let mut curator = Self::spawn(&["CuratorRwLock", connect, path], true);
        assert_eq!(curator.line(startup).await, "READY");
        curator
    }

    /// `CuratorLeaderLatch <connect> <path> <id>`: a started `LeaderLatch`
    /// on `path` with participant id `id`, driven by [`send`](Self::send)
    /// (`"await <ms>"` → `LEADER`/`TIMEOUT`, `"leader"` → `LEADER_IS
    /// <id>`, `"close"` → `CLOSED`) and answering by [`line`](Self::line).
    /// Returns once the latch is started.
    pub async fn leader_latch(connect: &str, path: &str, id: &str, startup: Duration) -> Self {
        let mut curator = Self::spawn(&["CuratorLeaderLatch", connect, path, id], true);
        assert_eq!(curator.line(startup).await, "READY");
        curator
    }

    /// `CuratorDoubleBarrier <connect> <path> <parties>`: one member of a
    /// `DistributedDoubleBarrier` on `path`, driven by [`send`](Self::send)
    /// (`"enter <ms>"` → `ENTERED`/`TIMEOUT`, `"leave <ms>"` →
    /// `LEFT`/`TIMEOUT`) and answering by [`line`](Self::line). Returns
    /// once the client is connected.
    pub async fn double_barrier(
        connect: &str,
        path: &str,
        parties: usize,
        startup: Duration,
    ) -> Self {
        let parties = parties.to_string();
        let mut curator = Self::spawn(&["CuratorDoubleBarrier", connect, path, &parties], true);
        assert_eq!(curator.line(startup).await, "READY");
        curator
    }

    fn spawn(args: &[&str], commands: bool) -> Self {
        let mut child = Command::new("java")
            .args([
                "-Xmx64m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(classpath())
            .args(args)
            .stdin(if commands {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("run java (Debian package default-jdk-headless)");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Curator {
            stdin: child.stdin.take(),
            child,
            lines,
            unclaimed: VecDeque::new(),
        }
    }

    /// The next line the program prints, within `limit`.
    pub async fn line(&mut self, limit: Duration) -> String {
        if let Some(line) = self.unclaimed.pop_front() {
            return line;
        }
        tokio::time::timeout(limit, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("Curator printed nothing within {limit:?}"))
            .expect("read Curator's output")
            .expect("Curator exited without a line")
    }

    /// Sends one command line to a `read_write` program.
    pub async fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("a program that takes commands");
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("send {command:?} to Curator: {e}"));
        stdin.flush().await.unwrap();
    }

    /// The next answer of `holder` (`ACQUIRED`, `TIMEOUT`, `RELEASED` or
    /// `ERROR …`), within `limit`; other holders' lines are kept for later.
    pub async fn answer(&mut self, holder: &str, limit: Duration) -> String {
        let prefix = format!("{holder} ");
        if let Some(i) = self.unclaimed.iter().position(|l| l.starts_with(&prefix)) {
            let line = self.unclaimed.remove(i).unwrap();
            return line[prefix.len()..].to_owned();
        }
        let read = async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .expect("read Curator's output")
                    .expect("Curator exited without answering");
                match line.strip_prefix(&prefix) {
                    Some(answer) => return answer.to_owned(),
                    None => self.unclaimed.push_back(line),
                }
            }
        };
        tokio::time::timeout(limit, read)
            .await
            .unwrap_or_else(|_| panic!("Curator holder {holder} answered nothing within {limit:?}"))
    }

    /// Whether `holder` has answered something not yet taken by
    /// [`answer`](Self::answer), looking no longer than `within`.
    pub async fn has_answered(&mut self, holder: &str, within: Duration) -> bool {
        let prefix = format!("{holder} ");
        if self.unclaimed.iter().any(|l| l.starts_with(&prefix)) {
            return true;
        }
        while let Ok(line) = tokio::time::timeout(within, self.lines.next_line()).await {
            let line = line
                .expect("read Curator's output")
                .expect("Curator exited");
            let theirs = line.starts_with(&prefix);
            self.unclaimed.push_back(line);
            if theirs {
                return true;
            }
        }
        false
    }

    /// Waits (at most 20 s) for the program to end, and checks it succeeded.
    /// A `read_write` program is told to quit first.
    pub async fn exits_cleanly(mut self) {
        if self.stdin.is_some() {
            self.send("quit").await;
        }
        drop(self.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("Curator did not exit within 20 s")
            .unwrap();
        assert!(status.success(), "Curator exited with {status}");
    }
}
