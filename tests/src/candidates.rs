//! Runs `election-candidate` binaries as separate OS processes and follows
//! what they print, for the liveness tests of elections whose leader
//! process is paused (SIGSTOP), resumed (SIGCONT) or killed (SIGKILL).

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

use crate::servers::process::all_threads_stopped;

/// What a candidate process printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// `ELECTED <term>`.
    Elected(u64),
    /// `LOST <term>`.
    Lost(u64),
    /// Its output ended: it exited.
    Exited,
}

/// One line of one candidate, and when it was read.
#[derive(Debug, Clone, Copy)]
pub struct Heard {
    /// Which candidate (its index in [`Candidates`]).
    pub who: usize,
    /// What it said.
    pub said: Said,
    /// When the test read it.
    pub at: Instant,
}

/// How a candidate process is started.
#[derive(Debug, Clone)]
pub struct CandidateSpec {
    /// The backend URL.
    pub url: String,
    /// The election's name.
    pub name: String,
    /// The leader's lease ttl.
    pub ttl: Duration,
    /// How long each process runs at most before it exits by itself.
    pub lifetime: Duration,
}

/// Several `election-candidate` processes of one election; killed when
/// dropped.
pub struct Candidates {
    children: Vec<Child>,
    /// Which candidates the test killed (their exit is expected).
    killed: Vec<bool>,
    heard: mpsc::UnboundedReceiver<Heard>,
}

impl Candidates {
    /// Starts `count` candidates from `binary` (pass
    /// `env!("CARGO_BIN_EXE_election-candidate")`), with the values
    /// `candidate-0`, `candidate-1`, …
    pub fn spawn(binary: &str, spec: &CandidateSpec, count: usize) -> Candidates {
        let (tx, heard) = mpsc::unbounded_channel();
        let mut children = Vec::new();
        for who in 0..count {
            let (child, stdout) = crate::holder::spawn_piped(
                binary,
                &[
                    spec.url.clone(),
                    spec.name.clone(),
                    format!("candidate-{who}"),
                    spec.ttl.as_millis().to_string(),
                    spec.lifetime.as_millis().to_string(),
                ],
            );
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let said = match line.split_once(' ') {
                        Some(("ELECTED", term)) => term.parse().ok().map(Said::Elected),
                        Some(("LOST", term)) => term.parse().ok().map(Said::Lost),
                        _ => None,
                    };
                    let Some(said) = said else {
                        eprintln!("candidate {who} printed {line:?}");
                        continue;
                    };
                    let at = Instant::now();
                    if tx.send(Heard { who, said, at }).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Heard {
                    who,
                    said: Said::Exited,
                    at: Instant::now(),
                });
            });
            children.push(child);
        }
        Candidates {
            killed: vec![false; children.len()],
            children,
            heard,
        }
    }

    /// The next `ELECTED` line of any candidate with a term above `after`
    /// (at most `limit` from now), as (who, term, when it was read); the
    /// other lines on the way are returned too, in order, for the report.
    /// `None` when none comes in time.
    pub async fn next_elected(
        &mut self,
        after: u64,
        limit: Duration,
    ) -> (Option<(usize, u64, Instant)>, Vec<Heard>) {
        let mut seen = Vec::new();
        let killed = &self.killed;
        let found = tokio::time::timeout(limit, async {
            while let Some(heard) = self.heard.recv().await {
                seen.push(heard);
                match heard.said {
                    Said::Elected(term) if term > after => {
                        return Some((heard.who, term, heard.at));
                    }
                    Said::Exited if !killed[heard.who] => {
                        panic!("candidate {} exited: {seen:?}", heard.who)
                    }
                    _ => {}
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        (found, seen)
    }

    /// Every line heard from now until `until`, in order.
    pub async fn all_until(&mut self, until: Instant) -> Vec<Heard> {
        let mut heard = Vec::new();
        let killed = &self.killed;
        let _ = tokio::time::timeout_at(until.into(), async {
            while let Some(h) = self.heard.recv().await {
                assert!(
                    h.said != Said::Exited || killed[h.who],
                    "candidate {} exited: {heard:?}",
                    h.who
                );
                heard.push(h);
            }
        })
        .await;
        heard
    }

    /// Freezes candidate `who` with SIGSTOP, and waits (up to 2 s) until
    /// every thread of it stopped.
    pub fn pause(&self, who: usize) {
        let pid = self.pid(who);
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP the candidate");
        let started = Instant::now();
        let raw = u32::try_from(pid.as_raw()).expect("a positive pid");
        while !all_threads_stopped(raw) {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "candidate {who} did not stop within 2 s of SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Lets a paused candidate go on with SIGCONT.
    pub fn resume(&self, who: usize) {
        kill(self.pid(who), Signal::SIGCONT).expect("SIGCONT the candidate");
    }

    /// Kills candidate `who` with SIGKILL, as a crash would, and reaps it.
    pub async fn kill9(&mut self, who: usize) {
        self.killed[who] = true;
        let child = &mut self.children[who];
        child.start_kill().expect("SIGKILL the candidate");
        let _ = child.wait().await;
    }

    fn pid(&self, who: usize) -> Pid {
        let id = self.children[who].id().expect("the candidate runs");
        Pid::from_raw(i32::try_from(id).expect("a pid fits in i32"))
    }
}
