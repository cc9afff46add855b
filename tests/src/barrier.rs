//! The double-barrier suite, for backends that have barriers.
//!
//! Backends opt in with [`barrier_suite!`](crate::barrier_suite) beside
//! their other suites. A member "killed" here stops renewing and is
//! forgotten (`mem::forget`, as a process that died keeps nothing): its
//! lease lapses after the fixture's short ttl, as a dead process's would
//! (on ZooKeeper its node is deleted then; the session's own end is tested
//! in `zookeeper_barrier.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Barrier, BarrierMember, LockBackend, LockError};

use crate::conformance::{unique_key, Fixture};

/// Expands to one `#[tokio::test]` per barrier case. The argument is an
/// expression that builds a fresh fixture, as for `conformance_suite!`.
#[macro_export]
macro_rules! barrier_suite {
    ($fixture:expr) => {
        $crate::barrier_suite!(@cases $fixture;
            enter_waits_for_parties,
            leave_waits_for_all,
            a_timed_out_enter_removes_its_member,
            a_killed_member_is_counted_out,
            cancel_at_every_await_leaves_nothing,
            all_parties_joined_in_one_task,
            the_name_is_reused_for_the_next_round,
            bad_inputs_are_rejected,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod barrier {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture;
                    $crate::barrier::$case(&fixture).await;
                }
            )*
        }
    };
}

/// Generous bound on every wait of the suite (loaded machines).
const LONG: Duration = Duration::from_secs(30);

fn barrier(backend: &Arc<dyn LockBackend>, name: &str, parties: usize) -> Barrier {
    Barrier::new(name, parties)
        .with_backend(backend.clone())
        .wait(LONG)
}

/// Enters `b`, owning it (so `join!` can hold the future).
async fn enter(b: Barrier) -> Result<BarrierMember, LockError> {
    b.enter().await
}

async fn backends<F: Fixture>(fixture: &F, n: usize) -> Vec<Arc<dyn LockBackend>> {
    let mut all = Vec::new();
    for _ in 0..n {
        all.push(fixture.backend().await);
    }
    all
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// 3 parties on 3 clients, 10 rounds on new names: nobody passes before
/// the third arrives; every member passes then. Prints how long after the
/// last arrival the members return (target: 250 ms).
pub async fn enter_waits_for_parties<F: Fixture>(fixture: &F) {
    let clients = backends(fixture, 3).await;
    let mut latencies = Vec::new();
    for round in 0..10 {
        let name = unique_key(&format!("barrier-enter-{round}"));
        let mut early = Vec::new();
        for backend in &clients[..2] {
            let b = barrier(backend, &name, 3);
            early.push(tokio::spawn(async move {
                let member = b.enter().await;
                (member, Instant::now())
            }));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            early.iter().all(|t| !t.is_finished()),
            "a member passed with 2 of 3 parties in"
        );
        let arrived = Instant::now();
        let last = barrier(&clients[2], &name, 3)
            .enter()
            .await
            .expect("the last member enters");
        latencies.push(arrived.elapsed());
        let mut members = vec![last];
        for task in early {
            let (member, at) = task.await.unwrap();
            members.push(member.expect("an early member enters"));
            latencies.push(at.saturating_duration_since(arrived));
        }
        let leaves = members.into_iter().map(BarrierMember::leave);
        for left in futures_util::future::join_all(leaves).await {
            left.expect("leave");
        }
    }
    latencies.sort();
    eprintln!(
        "barrier: enter returns after the last member arrives: p50 {:?}, max {:?} ({} members)",
        percentile(&latencies, 0.5),
        latencies[latencies.len() - 1],
        latencies.len()
    );
}

/// Two members in; the first to leave waits until the second leaves.
pub async fn leave_waits_for_all<F: Fixture>(fixture: &F) {
    let clients = backends(fixture, 2).await;
    let name = unique_key("barrier-leave");
    let (a, b) = tokio::join!(
        enter(barrier(&clients[0], &name, 2)),
        enter(barrier(&clients[1], &name, 2))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let first = tokio::spawn(a.leave());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !first.is_finished(),
        "leave returned with a member still in"
    );
    let left = Instant::now();
    b.leave().await.expect("the last member leaves");
    tokio::time::timeout(LONG, first)
        .await
        .expect("the first leave ends once all left")
        .unwrap()
        .expect("first leave");
    eprintln!(
        "barrier: leave returns {:?} after the last member left",
        left.elapsed()
    );
}

/// An enter that times out removes its member: a later lone member does not
/// find it (and times out too), a later full group opens the barrier.
pub async fn a_timed_out_enter_removes_its_member<F: Fixture>(fixture: &F) {
    let clients = backends(fixture, 2).await;
    let name = unique_key("barrier-timeout");
    let short = Duration::from_millis(300);
    let err = barrier(&clients[0], &name, 2)
        .wait(short)
        .enter()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let err = barrier(&clients[1], &name, 2)
        .wait(short)
        .enter()
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Timeout { .. }),
        "the timed-out member was still counted: {err:?}"
    );
    let (a, b) = tokio::join!(
        enter(barrier(&clients[0], &name, 2)),
        enter(barrier(&clients[1], &name, 2))
    );
    let (left_a, left_b) = tokio::join!(a.unwrap().leave(), b.unwrap().leave());
    left_a.unwrap();
    left_b.unwrap();
}

/// A member that stops renewing (its process died) is counted out within
/// its ttl: the others' `leave` goes on. Prints how long that took.
pub async fn a_killed_member_is_counted_out<F: Fixture>(fixture: &F) {
    let clients = backends(fixture, 2).await;
    let name = unique_key("barrier-killed");
    let ttl = fixture.short_ttl();
    let (doomed, survivor) = tokio::join!(
        enter(barrier(&clients[0], &name, 2).ttl(ttl).renew(false)),
        enter(barrier(&clients[1], &name, 2))
    );
    let (doomed, survivor) = (doomed.unwrap(), survivor.unwrap());
    let killed = Instant::now();
    // A dead process neither renews nor leaves.
    std::mem::forget(doomed);
    survivor
        .leave()
        .await
        .expect("leave goes on once the dead member is counted out");
    let took = killed.elapsed();
    eprintln!("barrier: a killed member was counted out after {took:?} (ttl {ttl:?})");
    assert!(took <= ttl * 3 + Duration::from_secs(5), "took {took:?}");
}

/// `enter` and `leave` dropped at several points: no member is left
/// behind (a later lone member times out; a later pair opens it), and a
/// dropped `leave` still leaves.
pub async fn cancel_at_every_await_leaves_nothing<F: Fixture>(fixture: &F) {
    let clients = backends(fixture, 2).await;
    let name = unique_key("barrier-cancel");
    for after in [0, 1, 2, 5, 10, 20, 50, 100] {
        let cut = Duration::from_millis(after);
        let _ = tokio::time::timeout(cut, barrier(&clients[0], &name, 2).enter()).await;
    }
    // Background removals have a moment to land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = barrier(&clients[1], &name, 2)
        .wait(Duration::from_millis(500))
        .enter()
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Timeout { .. }),
        "a cancelled enter left its member behind: {err:?}"
    );
    let (a, b) = tokio::join!(
        enter(barrier(&clients[0], &name, 2)),
        enter(barrier(&clients[1], &name, 2))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    // A's leave is dropped mid-way: A still leaves, so B's leave ends.
    let _ = tokio::time::timeout(Duration::from_millis(5), a.leave()).await;
    tokio::time::timeout(LONG, b.leave())
        .await
        .expect("a dropped leave still left")
        .unwrap();
}

/// Every party entered by `join!` in one task, on one client, and left
/// the same way.
pub async fn all_parties_joined_in_one_task<F: Fixture>(fixture: &F) {
    let backend = fixture.backend().await;
    let name = unique_key("barrier-join");
    let b = barrier(&backend, &name, 3);
    let (x, y, z) = tokio::time::timeout(LONG, async {
        tokio::join!(b.enter(), b.enter(), b.enter())
    })
    .await
    .expect("three members of one task open the barrier");
    let (x, y, z) = (x.unwrap(), y.unwrap(), z.unwrap());
    let (l1, l2, l3) = tokio::time::timeout(LONG, async {
        tokio::join!(x.leave(), y.leave(), z.leave())
    })
    .await
    .expect("three members of one task leave");
    l1.unwrap();
    l2.unwrap();
    l3.unwrap();
}

/// After every member of a round left, the barrier is closed again: a lone
/// member of the next round waits (and times out), a full group opens it.
pub async fn the_name_is_reused_for_the_next_round<F: Fixture>(fixture: &F) {
    let clients = backends(fixture, 2).await;
    let name = unique_key("barrier-rounds");
    for _ in 0..3 {
        let (a, b) = tokio::join!(
            enter(barrier(&clients[0], &name, 2)),
            enter(barrier(&clients[1], &name, 2))
        );
        let (la, lb) = tokio::join!(a.unwrap().leave(), b.unwrap().leave());
        la.unwrap();
        lb.unwrap();
        let err = barrier(&clients[0], &name, 2)
            .wait(Duration::from_millis(300))
            .enter()
            .await
            .unwrap_err();
        assert!(
            matches!(err, LockError::Timeout { .. }),
            "the barrier stayed open after its round: {err:?}"
        );
    }
}

/// Zero or huge parties, a bad name, a bad ttl: clear errors naming them;
/// `Duration::MAX` as the wait is no limit, not a panic.
pub async fn bad_inputs_are_rejected<F: Fixture>(fixture: &F) {
    let backend = fixture.backend().await;
    for parties in [0, Barrier::MAX_PARTIES + 1, usize::MAX] {
        let err = barrier(&backend, "barrier-bad", parties)
            .enter()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(err.to_string().contains("parties"), "{err}");
    }
    let err = barrier(&backend, "", 2).enter().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
    let err = barrier(&backend, "barrier-bad", 2)
        .ttl(Duration::MAX)
        .enter()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("ttl"), "{err}");
    let member = tokio::time::timeout(
        LONG,
        barrier(&backend, &unique_key("barrier-max-wait"), 1)
            .wait(Duration::MAX)
            .enter(),
    )
    .await
    .expect("a lone party of one passes")
    .unwrap();
    member.leave().await.unwrap();
}
