//! The leader election suite, for backends that have leader election.
//!
//! Backends opt in with [`election_suite!`](crate::election_suite) beside
//! their `conformance_suite!`. Separate clients of a fixture
//! ([`Fixture::backend`]) are separate processes as far as dlock is
//! concerned: their own connections, local queues and watchdogs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, ElectionBackend, Lease, PermitBackend, Renewal, RwBackend};
use dlock::{Election, Leader, LockBackend, LockError};
use futures_util::StreamExt;

use crate::conformance::{unique_key, Fixture};
use crate::fixtures::forward::Forward;
use crate::overlap::OverlapDetector;

/// Expands to one `#[tokio::test]` per election case. The argument is an
/// expression that builds a fresh fixture, as for `conformance_suite!`.
///
/// ```text
/// dlock_tests::election_suite!(MemoryFixture::default());
/// ```
#[macro_export]
macro_rules! election_suite {
    ($fixture:expr) => {
        $crate::election_suite!(@cases $fixture;
            one_leader_among_candidates_with_increasing_terms,
            a_stalled_leader_knows_before_its_successor_is_elected,
            resign_elects_the_next_candidate_at_once,
            observe_sees_every_term_in_order,
            observe_misses_no_term_however_short,
            proclaim_changes_the_value_not_the_term,
            a_removed_lease_ends_the_leadership,
            a_dropped_campaign_leaves_no_leadership,
            a_dropped_leadership_resigns,
            campaigns_cancelled_at_any_point_leave_nothing,
            bad_input_is_refused_clearly,
            elections_the_way_ordinary_code_runs_them,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod election {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture;
                    $crate::election::$case(&fixture).await;
                }
            )*
        }
    };
}

/// A lock service whose elections the suite can tamper with.
#[async_trait::async_trait]
pub trait ElectionFixture: Fixture {
    /// Removes the leader's lease of the election `name` behind its back,
    /// as an operator would. By default the lock of the name
    /// ([`Fixture::steal`]): where the election is that lock.
    async fn steal_leader(&self, name: &str) {
        self.steal(name).await;
    }

    /// Whether the backend's announcements carry the record, so that an
    /// observer sees every term however short. ZooKeeper's events name a
    /// node and not its data: there a term shorter than a read may be
    /// skipped.
    fn observes_every_term(&self) -> bool {
        true
    }
}

fn election(backend: &Arc<dyn LockBackend>, name: &str) -> Election {
    Election::new(name).with_backend(backend.clone())
}

/// `what` within `limit`, or a panic naming it.
async fn within<T>(limit: Duration, what: &str, work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"))
}

/// 3 clients × 2 candidates each win 3 terms apiece: never two leaders at
/// once, every term greater than the one before, and `leader()` from a
/// client that does not campaign shows each leader's value and term.
pub async fn one_leader_among_candidates_with_increasing_terms<F: ElectionFixture>(fixture: &F) {
    const CLIENTS: usize = 3;
    const PER_CLIENT: usize = 2;
    const TERMS_EACH: usize = 3;
    let name = unique_key("one-leader");
    let watcher = election(&fixture.backend().await, &name);
    let detector = Arc::new(OverlapDetector::default());
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let backend = fixture.backend().await;
        for candidate in 0..PER_CLIENT {
            let election = election(&backend, &name).wait(Duration::from_secs(60));
            let watcher = watcher.clone();
            let (detector, terms) = (detector.clone(), terms.clone());
            tasks.push(tokio::spawn(async move {
                let value = format!("node-{client}-{candidate}");
                for _ in 0..TERMS_EACH {
                    let leadership = election.campaign(value.clone()).await.expect("campaign");
                    detector.enter();
                    terms.lock().unwrap().push(leadership.term());
                    let seen = watcher.leader().await.expect("leader()");
                    assert_eq!(
                        seen,
                        Some(Leader {
                            value: value.clone(),
                            term: leadership.term()
                        }),
                        "leader() from another client shows the leader"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    assert!(leadership.is_leader());
                    detector.leave();
                    leadership.resign().await.expect("resign");
                }
            }));
        }
    }
    within(Duration::from_secs(120), "every term", async {
        for task in tasks {
            task.await.expect("a candidate panicked");
        }
    })
    .await;
    assert_eq!(detector.overlaps(), 0, "two leaders at once");
    let terms = terms.lock().unwrap().clone();
    assert_eq!(terms.len(), CLIENTS * PER_CLIENT * TERMS_EACH);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms not strictly increasing in election order: {terms:?}"
    );
    assert_eq!(watcher.leader().await.unwrap(), None, "all resigned");
}

/// A backend whose renewals can be made to hang, as a leader paused (GC,
/// a stopped VM) or cut off from the server would see them.
#[derive(Debug)]
pub struct Stalling {
    inner: Arc<dyn LockBackend>,
    stalled: AtomicBool,
}

impl Stalling {
    /// `inner`, renewing normally until [`stall`](Self::stall).
    pub fn wrap(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Stalling {
            inner,
            stalled: AtomicBool::new(false),
        })
    }

    /// From now on every renewal hangs (bounded: one minute).
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl LockBackend for Stalling {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.inner.try_acquire(req).await
    }
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.inner.acquire(req, deadline).await
    }
    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        if self.stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        self.inner.renew(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.inner.release(lease).await
    }
    fn permits(&self) -> Option<&dyn PermitBackend> {
        self.inner.permits()
    }
    fn rw(&self) -> Option<&dyn RwBackend> {
        self.inner.rw()
    }
    fn election(&self) -> Option<&dyn ElectionBackend> {
        self.inner.election()
    }
}

/// The leader's renewals stop (it is paused, or cut off): its
/// `is_leader()` turns false and `lost()` fires before the candidate of
/// another client is elected, with a greater term, once the server expired
/// the lease.
pub async fn a_stalled_leader_knows_before_its_successor_is_elected<F: ElectionFixture>(
    fixture: &F,
) {
    let name = unique_key("stalled");
    let ttl = fixture.short_ttl();
    let stalling = Stalling::wrap(fixture.backend().await);
    let a_backend: Arc<dyn LockBackend> = stalling.clone();
    let a = election(&a_backend, &name).ttl(ttl);
    let b = election(&fixture.backend().await, &name)
        .ttl(ttl)
        .wait(Duration::from_secs(30));
    let first = a.campaign("a").await.unwrap();
    let noticed = tokio::spawn(first.lost());
    stalling.stall();
    let second = within(
        Duration::from_secs(30),
        "the successor's election",
        b.campaign("b"),
    )
    .await
    .unwrap();
    assert!(
        !first.is_leader(),
        "the stalled leader still believes it leads while another is elected"
    );
    // Already fired: a `lost()` asked now is ready at once (a task that
    // awaited it may not have been scheduled yet on a loaded machine).
    assert!(
        futures_util::FutureExt::now_or_never(first.lost()).is_some(),
        "lost() had not fired when the successor was elected"
    );
    within(Duration::from_secs(5), "lost()", noticed)
        .await
        .unwrap();
    assert!(
        second.term() > first.term(),
        "{} > {}",
        second.term(),
        first.term()
    );
    assert_eq!(
        b.leader().await.unwrap(),
        Some(Leader {
            value: "b".into(),
            term: second.term()
        })
    );
    assert!(matches!(
        first.proclaim("a again").await,
        Err(LockError::NotHeld { .. })
    ));
    second.resign().await.unwrap();
    drop(first);
}

/// With a ttl of 30 s (so no expiry can be the cause), the waiting
/// candidate of another client is elected within 2 s of the leader's
/// resignation: woken by the server.
pub async fn resign_elects_the_next_candidate_at_once<F: ElectionFixture>(fixture: &F) {
    let name = unique_key("resign");
    let ttl = Duration::from_secs(30);
    let a = election(&fixture.backend().await, &name).ttl(ttl);
    let b = election(&fixture.backend().await, &name)
        .ttl(ttl)
        .wait(Duration::from_secs(25));
    for round in 0..3 {
        let first = a.campaign("a").await.unwrap();
        let first_term = first.term();
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.campaign("b").await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "round {round}: elected while the leader leads"
        );
        let resigned = Instant::now();
        first.resign().await.unwrap();
        let second = within(Duration::from_secs(25), "the next election", waiting)
            .await
            .unwrap()
            .unwrap();
        let took = resigned.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "round {round}: the next candidate was elected {took:?} after the resignation"
        );
        assert!(second.term() > first_term);
        second.resign().await.unwrap();
    }
}

/// An observer on a third client sees, in order: nobody, then for each of
/// 4 terms the leader, its proclaimed value (same term), and nobody after
/// its resignation; every term greater than the last.
pub async fn observe_sees_every_term_in_order<F: ElectionFixture>(fixture: &F) {
    let name = unique_key("observe");
    let clients = [fixture.backend().await, fixture.backend().await];
    let mut changes = observe_from_nobody(&election(&fixture.backend().await, &name)).await;
    let mut last_term = 0;
    for round in 0..4 {
        let value = format!("node-{round}");
        let leadership = election(&clients[round % 2], &name)
            .campaign(value.clone())
            .await
            .unwrap();
        let term = leadership.term();
        assert!(term > last_term, "term {term} after {last_term}");
        last_term = term;
        assert_eq!(
            next_change(&mut changes).await,
            Some(Leader { value, term })
        );
        let moved = format!("node-{round}:9090");
        leadership.proclaim(moved.clone()).await.unwrap();
        assert_eq!(
            next_change(&mut changes).await,
            Some(Leader { value: moved, term })
        );
        leadership.resign().await.unwrap();
        assert_eq!(
            next_change(&mut changes).await,
            None,
            "round {round}: nobody after the resignation"
        );
    }
}

/// Terms shorter than a read: an observer that does not look while five
/// leaders are elected and resign back to back still gets each of them, in
/// order, with its value, before the sixth (where announcements carry the
/// record; elsewhere the terms it gets only increase, and it gets the
/// sixth).
pub async fn observe_misses_no_term_however_short<F: ElectionFixture>(fixture: &F) {
    let name = unique_key("short-terms");
    let mut changes = observe_from_nobody(&election(&fixture.backend().await, &name)).await;
    let candidate = election(&fixture.backend().await, &name);
    let mut terms = Vec::new();
    for round in 0..5 {
        let value = format!("node-{round}");
        let leadership = candidate.campaign(value.clone()).await.unwrap();
        terms.push(Leader {
            value,
            term: leadership.term(),
        });
        leadership.resign().await.unwrap();
    }
    let last = candidate.campaign("node-last").await.unwrap();
    terms.push(Leader {
        value: "node-last".into(),
        term: last.term(),
    });
    let mut seen = Vec::new();
    loop {
        if let Some(leader) = next_change(&mut changes).await {
            let done = leader.term == last.term();
            seen.push(leader);
            if done {
                break;
            }
        }
    }
    assert!(
        seen.windows(2).all(|w| w[0].term < w[1].term),
        "terms out of order: {seen:?}"
    );
    if fixture.observes_every_term() {
        assert_eq!(seen, terms, "a short term was missed");
    }
    last.resign().await.unwrap();
}

/// `observer`'s changes, whose first must be that nobody leads yet.
async fn observe_from_nobody(
    observer: &Election,
) -> impl futures_util::Stream<Item = Option<Leader>> + Unpin {
    let mut changes = observer.observe();
    assert_eq!(
        next_change(&mut changes).await,
        None,
        "nobody leads at first"
    );
    changes
}

/// The next item of an `observe()` stream, within 10 s.
async fn next_change(
    changes: &mut (impl futures_util::Stream<Item = Option<Leader>> + Unpin),
) -> Option<Leader> {
    within(
        Duration::from_secs(10),
        "an observed change",
        changes.next(),
    )
    .await
    .expect("the stream ended")
}

/// `proclaim` changes what `leader()` shows on another client, and keeps
/// the term; the `Leadership` reports the new value.
pub async fn proclaim_changes_the_value_not_the_term<F: ElectionFixture>(fixture: &F) {
    let name = unique_key("proclaim");
    let leading = election(&fixture.backend().await, &name);
    let other = election(&fixture.backend().await, &name);
    let leadership = leading.campaign("node-a:8080").await.unwrap();
    let term = leadership.term();
    for port in [9090, 9091, 9092] {
        let value = format!("node-a:{port}");
        leadership.proclaim(value.clone()).await.unwrap();
        assert_eq!(leadership.value(), value);
        assert_eq!(leadership.term(), term);
        assert_eq!(other.leader().await.unwrap(), Some(Leader { value, term }));
    }
    leadership.resign().await.unwrap();
}

/// An operator removes the leader's lease: `lost()` fires, `is_leader()`
/// turns false, `leader()` shows nobody, `proclaim` is `NotHeld`, and the
/// next campaign gets a greater term.
pub async fn a_removed_lease_ends_the_leadership<F: ElectionFixture>(fixture: &F) {
    let name = unique_key("removed");
    let a = election(&fixture.backend().await, &name).ttl(fixture.short_ttl());
    let b = election(&fixture.backend().await, &name).wait(Duration::from_secs(10));
    let first = a.campaign("a").await.unwrap();
    fixture.steal_leader(&name).await;
    within(Duration::from_secs(10), "lost()", first.lost()).await;
    assert!(!first.is_leader());
    assert_eq!(b.leader().await.unwrap(), None);
    assert!(matches!(
        first.proclaim("a").await,
        Err(LockError::NotHeld { .. })
    ));
    let second = b.campaign("b").await.unwrap();
    assert!(second.term() > first.term());
    drop(first);
    second.resign().await.unwrap();
}

/// `candidate` campaigns as `value` and is elected within `limit` (else the
/// test fails: `kept` the election that long); `observer` then shows it as
/// the leader, with its term. It resigns.
async fn elected_within(
    candidate: &Election,
    value: &str,
    limit: Duration,
    observer: &Election,
    kept: &str,
) {
    let started = Instant::now();
    let leadership = candidate.campaign(value).await.unwrap();
    let took = started.elapsed();
    assert!(took < limit, "{kept} for {took:?}");
    assert_eq!(
        observer.leader().await.unwrap(),
        Some(Leader {
            value: value.into(),
            term: leadership.term()
        })
    );
    leadership.resign().await.unwrap();
}

/// A candidate campaigns as `value` on `election` while `who`, another
/// library's candidate, leads: it is not elected within a second; once
/// `resign` has made `who` resign, it is elected within 10 s. Returns its
/// leadership.
pub async fn elected_after_another_leader_resigns(
    election: &Election,
    value: &str,
    who: &str,
    resign: impl std::future::Future<Output = ()>,
) -> dlock::Leadership {
    let waiting = tokio::spawn({
        let (election, value) = (election.clone(), value.to_owned());
        async move { election.campaign(value).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiting.is_finished(),
        "dlock was elected while {who} leads"
    );
    resign.await;
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap_or_else(|_| panic!("dlock not elected within 10 s of {who}'s resignation"))
        .unwrap()
        .unwrap()
}

/// A campaign dropped while it waits leaves nothing: after the leader
/// resigns, a later candidate is elected at once and `leader()` shows it,
/// not the dropped one.
pub async fn a_dropped_campaign_leaves_no_leadership<F: ElectionFixture>(fixture: &F) {
    let name = unique_key("dropped-campaign");
    let a = election(&fixture.backend().await, &name);
    let b = election(&fixture.backend().await, &name);
    let c = election(&fixture.backend().await, &name).wait(Duration::from_secs(10));
    let first = a.campaign("a").await.unwrap();
    for _ in 0..3 {
        let dropped = tokio::time::timeout(Duration::from_millis(200), b.campaign("b")).await;
        assert!(dropped.is_err(), "elected while another leads");
    }
    first.resign().await.unwrap();
    elected_within(
        &c,
        "c",
        Duration::from_secs(2),
        &a,
        "a dropped campaign kept the election",
    )
    .await;
}

/// Dropping a `Leadership` resigns in the background: observers see nobody
/// lead, and the next candidate is elected without waiting for the ttl.
pub async fn a_dropped_leadership_resigns<F: ElectionFixture>(fixture: &F) {
    let name = unique_key("dropped-leadership");
    let a = election(&fixture.backend().await, &name).ttl(Duration::from_secs(30));
    let b = election(&fixture.backend().await, &name).wait(Duration::from_secs(5));
    let mut changes = b.observe();
    let first = a.campaign("a").await.unwrap();
    let term = first.term();
    loop {
        let seen = within(
            Duration::from_secs(10),
            "the leader observed",
            changes.next(),
        )
        .await;
        if seen
            == Some(Some(Leader {
                value: "a".into(),
                term,
            }))
        {
            break;
        }
    }
    drop(first);
    let seen = within(
        Duration::from_secs(10),
        "the resignation observed",
        changes.next(),
    )
    .await;
    assert_eq!(seen, Some(None));
    let second = b.campaign("b").await.unwrap();
    assert!(second.term() > term);
    second.resign().await.unwrap();
}

/// 40 campaigns cut short after 0 to 1.75 ms (some while waiting for the
/// lock, some between the grant and the record, some elected and then
/// dropped): with a 30 s ttl, another client's candidate is still elected
/// within 3 s, and `leader()` shows it.
pub async fn campaigns_cancelled_at_any_point_leave_nothing<F: ElectionFixture>(fixture: &F) {
    let name = unique_key("cancelled");
    let a = election(&fixture.backend().await, &name).ttl(Duration::from_secs(30));
    let b = election(&fixture.backend().await, &name).wait(Duration::from_secs(10));
    let mut elected = 0;
    for i in 0..40u64 {
        let cut = Duration::from_micros(250 * (i % 8));
        if let Ok(won) = tokio::time::timeout(cut, a.campaign("a")).await {
            drop(won.expect("a campaign that ended in time"));
            elected += 1;
        }
    }
    elected_within(
        &b,
        "b",
        Duration::from_secs(3),
        &a,
        &format!("after {elected} of 40 cut campaigns won, the election stayed taken"),
    )
    .await;
}

/// An empty name, a value over the backend's limit and a backend without
/// leader election are refused at once with errors that say what is wrong.
pub async fn bad_input_is_refused_clearly<F: ElectionFixture>(fixture: &F) {
    let backend = fixture.backend().await;
    let empty = election(&backend, "").campaign("a").await.unwrap_err();
    assert!(
        matches!(&empty, LockError::InvalidKey { reason, .. } if reason.contains("election name is empty")),
        "{empty}"
    );
    assert!(matches!(
        election(&backend, "").leader().await,
        Err(LockError::InvalidKey { .. })
    ));
    assert_eq!(
        election(&backend, "").observe().next().await,
        None,
        "observe() of an invalid name ends at once"
    );

    let name = unique_key("bad-input");
    let limit = backend
        .election()
        .expect("the backend has elections")
        .max_value_bytes();
    let long = "x".repeat(limit + 1);
    let too_long = election(&backend, &name)
        .campaign(long.clone())
        .await
        .unwrap_err();
    let text = too_long.to_string();
    assert!(
        matches!(too_long, LockError::InvalidOption { .. }) && text.contains(&limit.to_string()),
        "{text}"
    );
    let leadership = election(&backend, &name)
        .campaign("x".repeat(limit))
        .await
        .unwrap();
    assert!(matches!(
        leadership.proclaim(long).await,
        Err(LockError::InvalidOption { .. })
    ));
    let term = leadership.term();
    let nul = leadership.proclaim("node\0a").await.unwrap_err();
    assert!(
        matches!(nul, LockError::InvalidOption { .. }) && nul.to_string().contains("NUL"),
        "{nul}"
    );
    leadership.resign().await.unwrap();
    // A NUL in a value is refused on every backend before any request (PostgreSQL
    // cannot store it): no term is used up.
    let nul = election(&backend, &name)
        .campaign("node\0a")
        .await
        .unwrap_err();
    assert!(
        matches!(nul, LockError::InvalidOption { .. }) && nul.to_string().contains("NUL"),
        "{nul}"
    );
    let next = election(&backend, &name).campaign("node-b").await.unwrap();
    assert!(next.term() > term);
    next.resign().await.unwrap();

    let without = Forward::without_rw(backend.clone());
    assert!(without.election().is_none());
    let unsupported = election(&without, &name).campaign("a").await.unwrap_err();
    let text = unsupported.to_string();
    assert!(
        matches!(unsupported, LockError::InvalidOption { .. })
            && text.contains("without-rw(")
            && text.contains("no leader election"),
        "{text}"
    );
    assert!(matches!(
        election(&without, &name).leader().await,
        Err(LockError::InvalidOption { .. })
    ));
}

/// On a backend without leader election (Redlock: no fencing token, so no
/// term), every entry point is refused with an error that names the
/// backend and the backends that have elections.
pub async fn elections_are_refused_on<F: Fixture>(fixture: &F) {
    let backend = fixture.backend().await;
    assert!(backend.election().is_none());
    let election = election(&backend, &unique_key("refused"));
    let refused = election.campaign("a").await.unwrap_err();
    let text = refused.to_string();
    assert!(
        matches!(refused, LockError::InvalidOption { .. })
            && text.contains(&backend.describe())
            && text.contains("no leader election")
            && text.contains("redis://"),
        "{text}"
    );
    assert!(matches!(
        election.leader().await,
        Err(LockError::InvalidOption { .. })
    ));
    assert_eq!(election.observe().next().await, None);
}

/// An election run the way ordinary code does: two candidates campaigning
/// in one task (`join!` with the first's resignation), the leader read
/// from a second runtime, and a ttl of `Duration::MAX` (a clear error or a
/// leadership, never a panic or a hang).
pub async fn elections_the_way_ordinary_code_runs_them<F: Fixture>(fixture: &F) {
    let name = unique_key("election-ordinary");
    let backend = fixture.backend().await;
    let (first, second) = (election(&backend, &name), election(&backend, &name));
    let first_then_resign = async {
        let leadership = first.campaign("first").await.expect("the first is elected");
        let term = leadership.term();
        leadership.resign().await.unwrap();
        term
    };
    let second_after = async {
        tokio::time::timeout(Duration::from_secs(20), second.campaign("second"))
            .await
            .expect("the second is elected once the first resigns")
            .unwrap()
    };
    let (first_term, leadership) = tokio::join!(first_then_resign, second_after);
    assert!(
        leadership.term() > first_term,
        "a later term for the later leader"
    );
    // The leader, read from a second runtime.
    let (other, other_name) = (backend.clone(), name.clone());
    let seen = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move { election(&other, &other_name).leader().await.unwrap() })
    })
    .join()
    .expect("the second runtime's thread")
    .expect("a leader, seen from a second runtime");
    assert_eq!(
        (seen.value.as_str(), seen.term),
        ("second", leadership.term())
    );
    leadership.resign().await.unwrap();
    let long = election(&backend, &unique_key("election-long")).ttl(Duration::MAX);
    let answer = tokio::time::timeout(Duration::from_secs(10), long.campaign("long"))
        .await
        .expect("a ttl of Duration::MAX answers");
    match answer {
        Ok(leadership) => leadership.resign().await.unwrap(),
        Err(e) => assert!(
            matches!(e, LockError::InvalidOption { .. }),
            "Duration::MAX: a clear InvalidOption, not {e:?}"
        ),
    }
}
