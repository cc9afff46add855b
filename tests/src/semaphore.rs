//! The semaphore suite, for backends that have semaphores.
//!
//! Backends opt in with [`semaphore_suite!`](crate::semaphore_suite) beside
//! their `conformance_suite!`; it is a separate macro so that backends
//! without semaphores yet keep a passing conformance suite. The cases it
//! shares with the lock suite are in [`shared`](crate::shared).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockBackend, LockError, Semaphore};

use crate::conformance::{unique_key, Fixture};

mod available;
mod many;
pub mod processes;
pub use available::*;
pub use many::*;

/// Expands to one `#[tokio::test]` per semaphore case. The argument is an
/// expression that builds a fresh fixture, as for `conformance_suite!`.
#[macro_export]
macro_rules! semaphore_suite {
    ($fixture:expr) => {
        $crate::semaphore_suite!(@cases $fixture;
            never_more_than_n_holders,
            try_acquire_is_none_at_n,
            release_wakes_a_waiter_promptly,
            an_expired_permit_lets_local_waiters_in,
            zero_permits_is_rejected,
            another_permit_count_is_refused_with_both_numbers,
            the_count_may_change_once_every_permit_is_back,
            permits_the_way_ordinary_code_takes_them,
            mixed_counts_never_exceed_the_permits,
            try_acquire_many_is_all_or_nothing,
            counts_out_of_range_are_rejected,
            a_waiting_taker_of_many_is_not_overtaken,
            a_cancelled_acquire_many_leaves_nothing,
            an_expired_weighted_permit_frees_all_of_them,
            available_follows_single_permits,
            inspect_shows_holders_and_counts,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod semaphore {
            use super::*;
            $crate::shared_suite!($fixture, $crate::shared::Take::Permit);
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture;
                    $crate::semaphore::$case(&fixture).await;
                }
            )*
        }
    };
}

fn semaphore(backend: &Arc<dyn LockBackend>, name: &str, permits: usize) -> Semaphore {
    Semaphore::new(name, permits).with_backend(backend.clone())
}

/// The most holders seen inside at once.
#[derive(Default)]
struct Occupancy {
    inside: AtomicUsize,
    most: AtomicUsize,
}

impl Occupancy {
    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// 32 tasks on 4 clients × 25 cycles contend for 4 permits: never more
/// than 4 inside at once, and (with that much contention) all 4 are used.
///
/// Each holds its permit 20 ms: with holds of 300 µs, four grants had to
/// land within one hold, which a backend that takes permits one statement
/// at a time (PostgreSQL's gate) missed on a loaded CI machine (3 of 4
/// seen, 32 tasks × 100 cycles) although every waiter was served.
pub async fn never_more_than_n_holders<F: Fixture>(fixture: &F) {
    const PERMITS: usize = 4;
    const CLIENTS: usize = 4;
    const TASKS_PER_CLIENT: usize = 8;
    const CYCLES: usize = 25;
    const HOLD: Duration = Duration::from_millis(20);
    let name = unique_key("semaphore-n");
    let occupancy = Arc::new(Occupancy::default());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let backend = fixture.backend().await;
        for _ in 0..TASKS_PER_CLIENT {
            let semaphore = semaphore(&backend, &name, PERMITS).wait(Duration::from_secs(60));
            let occupancy = occupancy.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..CYCLES {
                    let permit = semaphore.acquire().await.expect("acquire a permit");
                    occupancy.enter();
                    tokio::time::sleep(HOLD).await;
                    occupancy.leave();
                    permit.release().await.expect("release a permit");
                }
            }));
        }
    }
    tokio::time::timeout(Duration::from_secs(240), async {
        for task in tasks {
            task.await.expect("a contending task panicked");
        }
    })
    .await
    .expect("never_more_than_n_holders did not finish within 240 s");
    let most = occupancy.most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS,
        "{most} holders at once with {PERMITS} permits"
    );
    assert_eq!(
        most, PERMITS,
        "32 contending tasks never filled all permits"
    );
}

pub async fn try_acquire_is_none_at_n<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-try");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let mut held = Vec::new();
    for _ in 0..3 {
        let permit = semaphore(&a, &name, 3).try_acquire().await.unwrap();
        held.push(permit.expect("a free permit"));
    }
    assert!(semaphore(&b, &name, 3)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    held.pop().unwrap().release().await.unwrap();
    let again = semaphore(&b, &name, 3).try_acquire().await.unwrap();
    assert!(again.is_some(), "a permit is free after a release");
}

/// A waiter in another process is woken by the release (not by the holder's
/// 30 s ttl).
pub async fn release_wakes_a_waiter_promptly<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-wake");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let held = semaphore(&a, &name, 2).acquire().await.unwrap();
    let _other = semaphore(&a, &name, 2).acquire().await.unwrap();
    let waiter = semaphore(&b, &name, 2).wait(Duration::from_secs(10));
    let waiting = tokio::spawn(async move {
        let permit = waiter.acquire().await?;
        Ok::<_, LockError>((Instant::now(), permit))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (got, permit) = waiting.await.unwrap().expect("the waiter got no permit");
    let handover = got - released;
    assert!(
        handover < Duration::from_secs(1),
        "hand-over took {handover:?}; a release must wake waiters"
    );
    permit.release().await.unwrap();
}

/// An expired permit that is kept alive (renewal off, the `Permit` not
/// dropped) lets a waiter of its own process in as soon as it expires, as it
/// lets in one of another process.
pub async fn an_expired_permit_lets_local_waiters_in<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-expired");
    let ttl = fixture.short_ttl();
    let a = fixture.backend().await;
    // One semaphore handle, two sets of options: the permit left to expire,
    // then the waiter behind it.
    let one_permit = semaphore(&a, &name, 1);
    let expiring = one_permit.clone().ttl(ttl).renew(false);
    let expiring = expiring.acquire().await.unwrap();
    let start = Instant::now();
    let waiter = one_permit.wait(ttl * 3 + Duration::from_secs(2));
    let next = waiter
        .acquire()
        .await
        .expect("a local waiter stayed behind an expired permit");
    let took = start.elapsed();
    assert!(
        took <= ttl + Duration::from_secs(2),
        "the local waiter got the permit after {took:?} (ttl {ttl:?})"
    );
    assert!(!expiring.is_held());
    next.release().await.unwrap();
    drop(expiring);
}

/// Asserts that `answer` is the refusal of a caller asking `asked`
/// permits of a semaphore stored with `stored`.
fn refused_count<T: std::fmt::Debug>(answer: Result<T, LockError>, stored: usize, asked: usize) {
    let err = answer.expect_err("a permit for another count");
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "has {stored} permits on the server, this caller asked for {asked}"
        )),
        "{text}"
    );
}

/// The first holder's count is the semaphore's: another count is refused
/// with both numbers, whether it tries once or waits, from another process
/// or the same one, and the refused caller takes no place (the holders'
/// count still fills up); the same count is served as usual.
pub async fn another_permit_count_is_refused_with_both_numbers<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-count");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let first = semaphore(&a, &name, 3).try_acquire().await.unwrap();
    let first = first.expect("a free permit");
    refused_count(semaphore(&b, &name, 1).try_acquire().await, 3, 1);
    refused_count(
        semaphore(&b, &name, 5)
            .wait(Duration::from_secs(2))
            .acquire()
            .await,
        3,
        5,
    );
    refused_count(semaphore(&a, &name, 2).try_acquire().await, 3, 2);
    let second = semaphore(&b, &name, 3).try_acquire().await.unwrap();
    let third = semaphore(&b, &name, 3).try_acquire().await.unwrap();
    assert!(
        second.is_some() && third.is_some(),
        "the refused callers took no permit"
    );
    assert!(
        semaphore(&a, &name, 3)
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "3 permits, all out"
    );
    for permit in [Some(first), second, third].into_iter().flatten() {
        permit.release().await.unwrap();
    }
}

/// Once every permit is back, the stored count goes with them: a caller
/// with a new count is served, and that count is the semaphore's now.
pub async fn the_count_may_change_once_every_permit_is_back<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-recount");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let mut held = Vec::new();
    for _ in 0..2 {
        let permit = semaphore(&a, &name, 3).try_acquire().await.unwrap();
        held.push(permit.expect("a free permit"));
    }
    refused_count(semaphore(&b, &name, 1).try_acquire().await, 3, 1);
    held.pop().unwrap().release().await.unwrap();
    refused_count(semaphore(&b, &name, 1).try_acquire().await, 3, 1);
    held.pop().unwrap().release().await.unwrap();
    let only = semaphore(&b, &name, 1)
        .try_acquire()
        .await
        .unwrap()
        .expect("every permit is back: a new count is served");
    refused_count(semaphore(&a, &name, 3).try_acquire().await, 1, 3);
    assert!(
        semaphore(&a, &name, 1)
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "1 permit, out"
    );
    only.release().await.unwrap();
}

pub async fn zero_permits_is_rejected<F: Fixture>(fixture: &F) {
    let a = fixture.backend().await;
    let err = semaphore(&a, "fine", 0).acquire().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("0 permits"), "{err}");
    let err = semaphore(&a, "", 2).acquire().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
}

/// Permits taken the way ordinary code does: two at once in one task
/// (`join!`), one from a second runtime while this one holds the other,
/// acquisitions dropped at every await (a `timeout` that fires at once,
/// then later and later), and extreme values (`usize::MAX` permits, a ttl
/// and a wait of `Duration::MAX`): each answers, a clear error or a permit,
/// and afterwards every permit is free again.
pub async fn permits_the_way_ordinary_code_takes_them<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-ordinary");
    let backend = fixture.backend().await;
    let sem = || semaphore(&backend, &name, 2);
    // Two at once in one task.
    let (one, two) = (sem(), sem());
    let (a, b) = tokio::join!(one.acquire(), two.acquire());
    let (a, b) = (
        a.expect("first of two in one task"),
        b.expect("second of two in one task"),
    );
    assert!(
        sem().try_acquire().await.unwrap().is_none(),
        "both permits are out"
    );
    b.release().await.unwrap();
    // The other permit from a second runtime, while this one holds `a`.
    let (other, other_name) = (backend.clone(), name.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let permit = semaphore(&other, &other_name, 2)
                .try_acquire()
                .await
                .unwrap()
                .expect("the free permit, from a second runtime");
            permit.release().await.unwrap();
        });
    })
    .join()
    .expect("the second runtime's thread");
    // Acquisitions dropped at every await: none may keep a permit.
    for step in 0..40u64 {
        let dropped = sem();
        let _ =
            tokio::time::timeout(Duration::from_micros(step * step * 50), dropped.acquire()).await;
    }
    a.release().await.unwrap();
    let (one, two) = (sem(), sem());
    let (x, y) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(10), one.acquire()),
        tokio::time::timeout(Duration::from_secs(10), two.acquire()),
    );
    let x = x.expect("no dropped acquisition kept a permit").unwrap();
    let y = y.expect("no dropped acquisition kept a permit").unwrap();
    x.release().await.unwrap();
    y.release().await.unwrap();
    // Extreme values: an answer within bounds, never a panic or a hang.
    let huge = unique_key("semaphore-huge");
    let huge = semaphore(&backend, &huge, usize::MAX);
    let answer = tokio::time::timeout(Duration::from_secs(10), huge.try_acquire())
        .await
        .expect("usize::MAX permits answers");
    match answer {
        Ok(Some(permit)) => permit.release().await.unwrap(),
        Ok(None) => panic!("usize::MAX permits, none held, yet none free"),
        Err(e) => assert!(
            matches!(e, LockError::InvalidOption { .. }),
            "usize::MAX permits: a clear InvalidOption, not {e:?}"
        ),
    }
    let long = sem().ttl(Duration::MAX).wait(Duration::MAX);
    let long = tokio::time::timeout(Duration::from_secs(10), long.acquire())
        .await
        .expect("a ttl and a wait of Duration::MAX answer");
    match long {
        Ok(permit) => permit.release().await.unwrap(),
        Err(e) => assert!(
            matches!(e, LockError::InvalidOption { .. }),
            "Duration::MAX: a clear InvalidOption, not {e:?}"
        ),
    }
}
