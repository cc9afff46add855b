//! `ensure()` after a pause, on real servers: a holder process frozen with
//! SIGSTOP past its ttl, while another client takes the lock (or the
//! leadership), makes no side effect once resumed: the request to write is
//! already waiting when it resumes, and `ensure()` right before the write
//! refuses it, whether or not the watchdog has marked the lease lost yet.
//! On Redis and etcd, for a lock and for a leadership (issue 46).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Election, Lock, LockBackend};
use dlock_tests::fixtures::etcd::EtcdFixture;
use dlock_tests::servers::process::freeze;
use dlock_tests::servers::redis::RedisServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const ENSURE_HOLDER: &str = env!("CARGO_BIN_EXE_ensure-holder");
const TTL: Duration = Duration::from_secs(2);
/// How long a step may take on a busy machine before the test gives up.
const LIMIT: Duration = Duration::from_secs(30);

/// The `ensure-holder` child: asked to write over stdin, answers on stdout.
struct Process {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Process {
    fn spawn(url: &str, what: &str, name: &str, effects: &std::path::Path) -> Process {
        let mut child = Command::new(ENSURE_HOLDER)
            .args([url, what, name, &TTL.as_millis().to_string()])
            .arg(effects)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start ensure-holder");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        Process {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        }
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(LIMIT, self.lines.next_line())
            .await
            .expect("ensure-holder answers within the limit")
            .expect("read its stdout")
            .expect("it is still running")
    }

    async fn ask_to_write(&mut self) {
        self.stdin
            .write_all(b"write\n")
            .await
            .expect("write to its stdin");
        self.stdin.flush().await.expect("flush its stdin");
    }

    fn signal(&self, signal: Signal) {
        let pid = self.child.id().expect("it runs");
        if signal == Signal::SIGSTOP {
            freeze(pid);
        } else {
            kill(Pid::from_raw(i32::try_from(pid).unwrap()), signal).expect("signal it");
        }
    }
}

/// Holds `name` in a child (a lock, or an election's leadership), freezes
/// it, lets `take_over` win `name` meanwhile (it returns the new fence or
/// term), then resumes the child with a write already requested.
async fn paused_holder_makes_no_side_effect<F, Fut>(url: &str, what: &str, name: &str, take_over: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    let mut process = Process::spawn(url, what, name, &effects);
    let first = process.line().await;
    let fence: u64 = first
        .strip_prefix("ACQUIRED ")
        .expect(&first)
        .parse()
        .unwrap();
    process.ask_to_write().await;
    assert_eq!(
        process.line().await,
        "WROTE",
        "a write while it holds goes through"
    );

    process.signal(Signal::SIGSTOP);
    let frozen_at = Instant::now();
    let next = take_over().await;
    println!(
        "{what} {name}: taken over with {next} (after fence {fence}) {:?} into the pause",
        frozen_at.elapsed()
    );
    assert!(
        next > fence,
        "the new holder's fence {next} is above {fence}"
    );
    // The request is waiting in the pipe when the process resumes.
    process.ask_to_write().await;
    process.signal(Signal::SIGCONT);
    let answer = process.line().await;
    assert!(answer.starts_with("REFUSED "), "{answer}");
    assert!(answer.contains(name), "the error names {name}: {answer}");
    let written = std::fs::read_to_string(&effects).unwrap();
    assert_eq!(
        written,
        format!("write {fence}\n"),
        "no side effect after the resume"
    );
}

async fn lock_taken_over(backend: Arc<dyn LockBackend>, key: &str) -> u64 {
    let guard = Lock::new(key)
        .with_backend(backend)
        .wait(LIMIT)
        .acquire()
        .await
        .expect("the lock is free once the frozen holder's lease expired");
    let fence = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    fence
}

async fn leadership_taken_over(backend: Arc<dyn LockBackend>, name: &str) -> u64 {
    let election = Election::new(name).with_backend(backend).wait(LIMIT);
    let leadership = election
        .campaign("the-next-leader")
        .await
        .expect("elected once the frozen leader's lease expired");
    let term = leadership.term();
    leadership.resign().await.unwrap();
    term
}

/// A paused holder of a lock, then a paused leader, on `url`'s backend:
/// neither makes a side effect after its successor took over.
async fn lock_and_leadership(url: &str) {
    let backend = dlock::connect(url).await.unwrap();
    let b = backend.clone();
    paused_holder_makes_no_side_effect(url, "lock", "report:nightly", || {
        lock_taken_over(b, "report:nightly")
    })
    .await;
    paused_holder_makes_no_side_effect(url, "lead", "scheduler", || {
        leadership_taken_over(backend, "scheduler")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_and_leadership() {
    let server = RedisServer::start();
    lock_and_leadership(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_lock_and_leadership() {
    let fixture = EtcdFixture::single();
    lock_and_leadership(fixture.url()).await;
}
