//! Election liveness with leaders in processes of their own: a leader
//! process paused (SIGSTOP) past its ttl and resumed, or killed (SIGKILL),
//! is followed by a leader within a bound the backend states (its ttl, or
//! the session timeout where the server holds the lease for a session),
//! plus slack. Every figure is printed.
//!
//! Backends opt in with [`election_process_suite!`](crate::election_process_suite)
//! beside their `election_suite!`; the test binary must be in this crate,
//! whose `election-candidate` binary runs the candidates.

use std::time::{Duration, Instant};

use dlock::{Election, Leader};

use crate::candidates::{CandidateSpec, Candidates, Said};
use crate::conformance::unique_key;
use crate::election::ElectionFixture;

/// Expands to one `#[tokio::test]` per case. The first argument builds a
/// fresh fixture (it may `.await`); the second is
/// `env!("CARGO_BIN_EXE_election-candidate")`.
///
/// ```text
/// dlock_tests::election_process_suite!(RedisFixture::restricted(), env!("CARGO_BIN_EXE_election-candidate"));
/// ```
#[macro_export]
macro_rules! election_process_suite {
    ($fixture:expr, $binary:expr) => {
        mod election_processes {
            use super::*;
            $crate::election_process_suite!(@cases $fixture, $binary;
                a_paused_leader_process_is_replaced,
                a_killed_leader_process_is_replaced,
                a_leader_is_elected_after_a_server_restart,
            );
        }
    };
    (@cases $fixture:expr, $binary:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let mut fixture = $fixture;
                $crate::election_processes::$case(&mut fixture, $binary).await;
            }
        )*
    };
}

/// A lock service whose election candidates can run in processes of their
/// own.
pub trait LeaderProcessFixture: ElectionFixture {
    /// The URL a candidate process connects with.
    fn candidate_url(&self) -> String;

    /// The leader's ttl in these cases.
    fn process_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// How long a leader process stays paused: past its ttl (so that it
    /// has lost the leadership when it resumes), and, where a session
    /// holds the lease, short of the session timeout (so that the resumed
    /// leader's own clean-up is what frees the election, not the server).
    fn pause(&self) -> Duration {
        self.process_ttl() * 2 + Duration::from_millis(500)
    }

    /// How long after its process froze the server frees a leader's lease
    /// without its help: the ttl where the server expires leases (Redis,
    /// etcd); the session timeout where a session holds them (ZooKeeper,
    /// PostgreSQL).
    fn frozen_leader_freed_after(&self) -> Duration {
        self.process_ttl()
    }

    /// How long after its process was killed the server frees a leader's
    /// lease: the ttl by default; the session timeout on ZooKeeper; about
    /// nothing on PostgreSQL, whose server ends the session when its
    /// connection closes.
    fn killed_leader_freed_after(&self) -> Duration {
        self.process_ttl()
    }

    /// Stops the server and starts it again (same port, same data), and
    /// returns once it answers. Called on a blocking thread.
    fn restart_server(&mut self);
}

/// What a bound may be late by on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);

/// How long the candidates live at most (they exit by themselves then).
const LIFETIME: Duration = Duration::from_secs(180);

/// How long the first election may take (processes start, connect).
const FIRST_ELECTION: Duration = Duration::from_secs(60);

/// Two candidate processes of a fresh election, and the first leader.
async fn two_candidates<F: LeaderProcessFixture>(
    fixture: &F,
    binary: &str,
    name: &str,
) -> (Candidates, usize, u64) {
    let spec = CandidateSpec {
        url: fixture.candidate_url(),
        name: name.to_owned(),
        ttl: fixture.process_ttl(),
        lifetime: LIFETIME,
    };
    let mut candidates = Candidates::spawn(binary, &spec, 2);
    let (first, seen) = candidates.next_elected(0, FIRST_ELECTION).await;
    let Some((leader, term, _)) = first else {
        panic!("no candidate was elected within {FIRST_ELECTION:?}: {seen:?}");
    };
    // Both candidates run and campaign: the other one waits now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (candidates, leader, term)
}

/// Three rounds: the leader's process is paused for
/// [`pause`](LeaderProcessFixture::pause) (past its ttl), then resumed. A
/// leader is elected (the other candidate, or the resumed one campaigning
/// again) no later than the server frees the frozen lease or the resumed
/// leader gives it up, whichever comes first, plus 3 s of slack; never left
/// leaderless for good by the resumed leader's stale place in the queue.
pub async fn a_paused_leader_process_is_replaced<F: LeaderProcessFixture>(
    fixture: &mut F,
    binary: &str,
) {
    const ROUNDS: usize = 3;
    let (mut candidates, mut leader, mut term) =
        two_candidates(fixture, binary, &unique_key("paused")).await;
    let pause = fixture.pause();
    let freed_after = fixture.frozen_leader_freed_after();
    for round in 0..ROUNDS {
        candidates.pause(leader);
        let paused = Instant::now();
        let (during, mut seen) = candidates.next_elected(term, pause).await;
        candidates.resume(leader);
        let resumed = Instant::now();
        let elected = match during {
            Some(elected) => Some(elected),
            None => {
                let limit = freed_after.max(pause) + SLACK * 2;
                let (after, more) = candidates.next_elected(term, limit).await;
                seen.extend(more);
                after
            }
        };
        let Some((next, next_term, at)) = elected else {
            panic!("round {round}: no leader after the paused leader {leader} resumed: {seen:?}");
        };
        let from_pause = at - paused;
        let when = if at < resumed {
            "during the pause".to_owned()
        } else {
            format!("{:?} after it resumed", at - resumed)
        };
        eprintln!(
            "round {round}: candidate {next} elected (term {next_term}) {from_pause:?} after the leader {leader} was paused, {when} (paused for {pause:?}, ttl {:?}, freed by the server after {freed_after:?})",
            fixture.process_ttl()
        );
        let bound = freed_after.min(resumed - paused) + SLACK;
        assert!(
            from_pause <= bound,
            "round {round}: leaderless for {from_pause:?} after the pause (bound {bound:?}): {seen:?}"
        );
        (leader, term) = (next, next_term);
        // The resumed candidate noticed its loss and campaigns again.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The leader's process is killed (SIGKILL): the other candidate is
/// elected within [`killed_leader_freed_after`](LeaderProcessFixture::killed_leader_freed_after)
/// plus 3 s of slack.
pub async fn a_killed_leader_process_is_replaced<F: LeaderProcessFixture>(
    fixture: &mut F,
    binary: &str,
) {
    let (mut candidates, leader, term) =
        two_candidates(fixture, binary, &unique_key("killed")).await;
    candidates.kill9(leader).await;
    let killed = Instant::now();
    let bound = fixture.killed_leader_freed_after() + SLACK;
    let (elected, seen) = candidates.next_elected(term, bound + SLACK).await;
    let Some((next, next_term, at)) = elected else {
        panic!(
            "no leader within {:?} of the leader's SIGKILL: {seen:?}",
            bound + SLACK
        );
    };
    let took = at - killed;
    eprintln!(
        "candidate {next} elected (term {next_term}) {took:?} after the leader {leader} was killed (ttl {:?}, freed by the server after {:?})",
        fixture.process_ttl(),
        fixture.killed_leader_freed_after()
    );
    assert_ne!(next, leader, "the killed candidate cannot be elected");
    assert!(
        took <= bound,
        "leaderless for {took:?} after the kill (bound {bound:?})"
    );
}

/// The server is restarted under two candidates. Whatever it kept (etcd's
/// leases, ZooKeeper's sessions) or lost (Redis without persistence,
/// PostgreSQL's sessions), a candidate leads within the ttl plus 3 s of slack
/// plus the restart's own length (the machine's speed at that moment) of the
/// server answering again, and every leaderless stretch the
/// candidates report after it ends within that too; another client's
/// `leader()` then names that candidate and term.
pub async fn a_leader_is_elected_after_a_server_restart<F: LeaderProcessFixture>(
    fixture: &mut F,
    binary: &str,
) {
    let name = unique_key("restart");
    let (mut candidates, leader, term) = two_candidates(fixture, binary, &name).await;
    let stopped = Instant::now();
    tokio::task::block_in_place(|| fixture.restart_server());
    let back = Instant::now();
    // The restart's own length is this machine's speed right now (0.7 s for
    // a ZooKeeper restart on an idle 2-core machine, seconds beside the
    // suite): every step after it (reconnect, session, the loser's clean-up,
    // the next candidate's watch) is as slow, so the slack grows with it.
    let bound = fixture.process_ttl() + SLACK + (back - stopped);
    let heard = candidates.all_until(back + bound + SLACK).await;
    // Who leads, by what the candidates said; when the last leaderless
    // stretch began (if one is open).
    let mut leads = Some((leader, term));
    let mut leaderless_since: Option<Instant> = None;
    let mut longest_after_back = Duration::ZERO;
    for h in &heard {
        match h.said {
            Said::Elected(t) => {
                if let Some(since) = leaderless_since.take() {
                    let gap = h.at - since.max(back);
                    longest_after_back = longest_after_back.max(gap);
                    assert!(
                        h.at <= since.max(back) + bound,
                        "leaderless from {:?} after the restart began until {:?} (the restart took {:?}; bound {bound:?} after it): {heard:?}",
                        since - stopped,
                        h.at - stopped,
                        back - stopped
                    );
                }
                leads = Some((h.who, t));
            }
            Said::Lost(t) if leads == Some((h.who, t)) => {
                leads = None;
                leaderless_since = Some(h.at);
            }
            _ => {}
        }
    }
    let Some((now_leads, now_term)) = leads else {
        panic!(
            "nobody leads {:?} after the server answered again: {heard:?}",
            bound + SLACK
        );
    };
    eprintln!(
        "server restarted in {:?}; then candidate {now_leads} leads (term {now_term}; before: candidate {leader}, term {term}); the longest leaderless stretch after the server answered: {longest_after_back:?}; heard {heard:?}",
        back - stopped
    );
    let election = Election::new(name.as_str()).with_backend(fixture.backend().await);
    assert_eq!(
        election.leader().await.expect("leader()"),
        Some(Leader {
            value: format!("candidate-{now_leads}"),
            term: now_term
        }),
        "leader() from another client"
    );
}
