//! `acquire_many` from 10 processes (the `many-permits-taker` binary) on a
//! semaphore of 10 permits, n in 1..=4 each: never more than 10 permits
//! out, and the processes served in arrival order (a taker of 4 is never
//! overtaken by a later taker of 1).
//!
//! The test holds all 10 permits, starts the takers one by one (each is
//! in line on the server before the next starts), then lets the permits
//! go: the first grants must come in start order. Each taker then takes
//! again, freely, for a few rounds. Every grant and give-back is a line of
//! a shared file (see the binary); its running sum is what was out.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockBackend, Semaphore};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::conformance::unique_key;

const TAKERS: usize = 10;
const PERMITS: usize = 10;
const ROUNDS: usize = 4;

/// What each taker asks for: 1 to 4, the 4s among 1s so that a taker of 4
/// waits in front of later takers of 1 while some permits are free.
fn count_of(taker: usize) -> usize {
    [4, 1, 1, 3, 4, 1, 2, 4, 1, 2][taker % 10]
}

/// Runs the case on the service at `url` (what the takers connect to);
/// `backend` is this process's own client of it.
pub async fn ten_processes_take_many_permits_in_order(
    binary: &str,
    url: &str,
    backend: Arc<dyn LockBackend>,
) {
    let name = unique_key("semaphore-processes");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("tally");
    std::fs::write(&log, "").unwrap();
    let all = Semaphore::new(name.as_str(), PERMITS)
        .with_backend(backend.clone())
        .acquire_many(PERMITS)
        .await
        .expect("all 10 permits, before the takers start");
    let mut children = Vec::new();
    for taker in 0..TAKERS {
        let mut child = Command::new(binary)
            .args([
                url,
                &name,
                &PERMITS.to_string(),
                &count_of(taker).to_string(),
                &log.display().to_string(),
                "150",
                &ROUNDS.to_string(),
                &taker.to_string(),
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start a taker process");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a taker did not start within 30 s")
            .unwrap();
        assert_eq!(first.as_deref(), Some("WAITING"), "taker {taker}");
        // In line on the server before the next one starts.
        tokio::time::sleep(Duration::from_millis(400)).await;
        children.push((child, lines));
    }
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "",
        "a taker got permits while all 10 were held"
    );
    let released = Instant::now();
    all.release().await.unwrap();
    for (taker, (mut child, mut lines)) in children.into_iter().enumerate() {
        let last = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("taker {taker} did not finish within 120 s"))
            .unwrap();
        assert_eq!(last.as_deref(), Some("DONE"), "taker {taker}");
        let status = child.wait().await.unwrap();
        assert!(status.success(), "taker {taker}: {status}");
    }
    eprintln!(
        "{TAKERS} processes × {ROUNDS} rounds done {:?} after the release",
        released.elapsed()
    );
    let tally = std::fs::read_to_string(&log).unwrap();
    let (mut out, mut most, mut first_grants) = (0i64, 0i64, Vec::new());
    for line in tally.lines() {
        let (delta, taker) = line.split_once(' ').expect("a tally line");
        let delta: i64 = delta.parse().expect("a signed count");
        out += delta;
        most = most.max(out);
        assert!(out <= PERMITS as i64, "{out} permits out at once:\n{tally}");
        let taker: usize = taker.parse().unwrap();
        if delta > 0 && !first_grants.contains(&taker) {
            first_grants.push(taker);
            // An earlier taker not granted yet would not fit beside what is
            // out: it was still waiting when this later one was served. (A
            // grant is logged just after it happens, so two grants close
            // together may log out of order; the sum proves the wait.)
            for earlier in (0..taker).filter(|i| !first_grants.contains(i)) {
                assert!(
                    out + count_of(earlier) as i64 <= PERMITS as i64,
                    "taker {taker} was served while taker {earlier} (of {}) waited \
                     in front of it:\n{tally}",
                    count_of(earlier)
                );
            }
        }
    }
    assert_eq!(out, 0, "every permit was given back");
    assert_eq!(tally.lines().count(), TAKERS * ROUNDS * 2);
    eprintln!("at most {most} of {PERMITS} permits out; first grants in order {first_grants:?}");
    assert_eq!(first_grants.len(), TAKERS);
    assert!(most > 4, "the takers never overlapped: {most} at most");
    let free = Semaphore::new(name.as_str(), PERMITS)
        .with_backend(backend)
        .available()
        .await
        .unwrap();
    assert_eq!(free, PERMITS);
}
