//! The one conformance suite every backend passes.
//!
//! A backend's test file builds a [`Fixture`] (a real server plus a way to
//! reach it) and calls [`conformance_suite!`](crate::conformance_suite), which
//! expands to one `#[tokio::test]` per case below and per case it shares
//! with the semaphore suite ([`shared`](crate::shared)). Each case builds its
//! own fixture, so cases run in parallel without sharing a server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError, LockGuard};

use crate::acquisitions::acquire_and_release;
pub use crate::hold_at_least::*;
pub use crate::keys::*;
pub use crate::nesting::*;
pub use crate::operations::*;
pub use crate::ordinary_code::*;
use crate::overlap::OverlapDetector;
pub use crate::short_waits::*;

/// A lock service under test.
#[async_trait::async_trait]
pub trait Fixture: Send + Sync + 'static {
    /// A new client of the fixture's server (a new connection, as another
    /// process would have).
    async fn backend(&self) -> Arc<dyn LockBackend>;

    /// Removes the lease on `key` behind its holder's back, as an operator
    /// would (`DEL`, `etcdctl del`, deleting the ZooKeeper node).
    async fn steal(&self, key: &str);

    /// Whether the backend promises fencing tokens (false only for Redlock).
    fn fencing(&self) -> bool {
        true
    }

    /// Whether the backend's semaphores take several permits at once
    /// (`Semaphore::acquire_many(n)` with n > 1); false only for MySQL,
    /// whose weighted cases check the typed refusal instead.
    fn many_permits(&self) -> bool {
        true
    }

    /// A ttl short enough to make expiry tests quick, long enough for the
    /// backend's own granularity (etcd leases are whole seconds).
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// Expands to one `#[tokio::test]` per conformance case. The argument is an
/// expression (it may `.await`) that builds a fresh fixture.
///
/// ```text
/// dlock_tests::conformance_suite!(RedisFixture::start().await);
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:expr) => {
        $crate::conformance_suite!(@cases $fixture;
            mutual_exclusion,
            try_acquire_is_none_while_held,
            lost_fires_when_the_lease_is_removed,
            fencing_tokens_strictly_increase,
            reentrancy_follows_the_holders_scope,
            concurrent_branches_of_one_task_contend,
            other_tasks_contend_normally,
            drop_hands_over_promptly,
            cancelled_acquire_leaves_nothing_behind,
            invalid_input_is_rejected,
            keys_that_print_alike_are_refused,
            the_shortest_ttl_works,
            reacquire_after_loss_while_the_lost_guard_lives,
            a_lease_of_a_second_runtime_is_renewed,
            a_guard_dropped_with_its_runtime_frees_the_key,
            cancelled_release_never_gives_two_holders,
            nested_keys_are_independent,
            a_backend_connected_on_an_idle_runtime_keeps_renewing,
            every_valid_key_round_trips,
            short_waits_time_out_never_fail,
            hold_at_least_runs_once_per_tick,
            inspect_shows_the_holder,
            force_release_evicts_the_holder,
            extend_lengthens_a_hard_lease,
            list_shows_the_held_keys,
            the_attribute_holds_the_lock_for_its_body,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $crate::shared_suite!($fixture, $crate::shared::Take::Lock);
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $fixture;
                $crate::conformance::$case(&fixture).await;
            }
        )*
    };
}

pub(crate) fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// A key no other case or run uses, so cases can share a server.
pub(crate) fn unique_key(case: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "conformance:{case}:{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// 16 tasks on 4 clients × 200 cycles each increment a counter with a
/// non-atomic read-yield-write; the lock alone keeps increments from being
/// lost. An overlap detector checks the same thing directly.
pub async fn mutual_exclusion<F: Fixture>(fixture: &F) {
    const CLIENTS: usize = 4;
    const TASKS_PER_CLIENT: usize = 4;
    const CYCLES: u64 = 200;
    let key = unique_key("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let detector = Arc::new(OverlapDetector::default());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let backend = fixture.backend().await;
        for _ in 0..TASKS_PER_CLIENT {
            let lock = lock(&backend, &key).wait(Duration::from_secs(60));
            let (counter, detector) = (counter.clone(), detector.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..CYCLES {
                    let guard = lock.acquire().await.expect("acquire in mutual_exclusion");
                    detector.enter();
                    let read = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(read + 1, Ordering::SeqCst);
                    detector.leave();
                    guard.release().await.expect("release in mutual_exclusion");
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
    .expect("mutual_exclusion did not finish within 240 s");
    let expected = (CLIENTS * TASKS_PER_CLIENT) as u64 * CYCLES;
    assert_eq!(detector.overlaps(), 0, "two holders overlapped");
    assert_eq!(
        counter.load(Ordering::SeqCst),
        expected,
        "increments were lost"
    );
}

pub async fn try_acquire_is_none_while_held<F: Fixture>(fixture: &F) {
    let key = unique_key("try");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let held = lock(&a, &key).acquire().await.unwrap();
    assert!(lock(&b, &key).try_acquire().await.unwrap().is_none());
    held.release().await.unwrap();
    let second = lock(&b, &key).try_acquire().await.unwrap();
    assert!(second.is_some(), "free after release");
}

pub async fn lost_fires_when_the_lease_is_removed<F: Fixture>(fixture: &F) {
    let key = unique_key("lost");
    let ttl = fixture.short_ttl();
    let a = fixture.backend().await;
    let guard = lock(&a, &key).ttl(ttl).acquire().await.unwrap();
    let lost = guard.lost();
    fixture.steal(&key).await;
    let start = Instant::now();
    tokio::time::timeout(ttl + Duration::from_secs(1), lost)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "lost() did not fire within {:?}",
                ttl + Duration::from_secs(1)
            )
        });
    assert!(start.elapsed() <= ttl + Duration::from_secs(1));
    assert!(!guard.is_held());
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
}

pub async fn fencing_tokens_strictly_increase<F: Fixture>(fixture: &F) {
    let key = unique_key("fence");
    let clients = [fixture.backend().await, fixture.backend().await];
    let mut last: Option<u64> = None;
    for round in 0..20 {
        let guard = lock(&clients[round % 2], &key).acquire().await.unwrap();
        let token = guard.fencing_token();
        if fixture.fencing() {
            let token = token.expect("a fencing backend gave no token");
            if let Some(prev) = last {
                assert!(token > prev, "token {token} after {prev}");
            }
            last = Some(token);
        } else {
            assert_eq!(
                token, None,
                "a backend without fencing must not invent tokens"
            );
        }
        guard.release().await.unwrap();
    }
}

pub async fn other_tasks_contend_normally<F: Fixture>(fixture: &F) {
    let key = unique_key("tasks");
    let a = fixture.backend().await;
    let held = lock(&a, &key).acquire().await.unwrap();
    let other = lock(&a, &key);
    let attempt = tokio::spawn(async move { other.try_acquire().await.map(|g| g.is_some()) });
    assert!(
        !attempt.await.unwrap().unwrap(),
        "another task of the same process got the lock"
    );
    held.release().await.unwrap();
}

pub async fn drop_hands_over_promptly<F: Fixture>(fixture: &F) {
    let key = unique_key("handover");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let held = lock(&a, &key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = lock(&b, &key).wait(Duration::from_secs(10));
    let waiting = tokio::spawn(async move {
        let guard: LockGuard = waiter.acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dropped_at = Instant::now();
    drop(held);
    let (got_at, guard) = waiting
        .await
        .unwrap()
        .expect("the waiter never got the lock");
    let handover = got_at - dropped_at;
    assert!(
        handover < Duration::from_secs(2),
        "hand-over took {handover:?}; drop must release, not wait for expiry"
    );
    guard.release().await.unwrap();
}

pub async fn cancelled_acquire_leaves_nothing_behind<F: Fixture>(fixture: &F) {
    let key = unique_key("cancel");
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let held = lock(&a, &key).acquire().await.unwrap();
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), lock(&b, &key).acquire()).await;
    assert!(
        cancelled.is_err(),
        "the waiter should still have been waiting"
    );
    held.release().await.unwrap();
    // Cleanup of a server-side queue entry may run in the background: give it
    // a bounded moment, then the key must be free for a third client.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(guard) = lock(&c, &key).try_acquire().await.unwrap() {
            guard.release().await.unwrap();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a cancelled waiter still blocks the key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Keys holding a bidirectional control or a zero-width character print
/// like other keys while being other locks: every backend refuses them as
/// `InvalidKey`, naming the code point, before any request.
pub async fn keys_that_print_alike_are_refused<F: Fixture>(fixture: &F) {
    let a = fixture.backend().await;
    for (key, code) in [
        ("invoice\u{202E}fdp.exe", "U+202E"),
        ("order\u{200B}:42", "U+200B"),
        ("order\u{2028}42", "U+2028"),
        ("\u{FEFF}order:42", "U+FEFF"),
        ("order\u{2067}:42", "U+2067"),
    ] {
        let err = lock(&a, key).acquire().await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, LockError::InvalidKey { .. }) && text.contains(code),
            "{key:?}: {text}"
        );
    }
    let plain = unique_key("order:42");
    acquire_and_release(&lock(&a, &plain)).await;
}

pub async fn invalid_input_is_rejected<F: Fixture>(fixture: &F) {
    let a = fixture.backend().await;
    for key in [
        String::new(),
        "bad\nkey".to_owned(),
        "k".repeat(dlock::MAX_KEY_BYTES + 1),
    ] {
        let err = lock(&a, &key).acquire().await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidKey { .. }),
            "{key:?}: {err:?}"
        );
    }
    for ttl in [
        Duration::ZERO,
        dlock::MAX_TTL + Duration::from_nanos(1),
        Duration::MAX,
    ] {
        let err = lock(&a, "fine").ttl(ttl).acquire().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(err.to_string().contains("ttl"), "{err}");
    }
    // A wait too long to end is no limit, and the longest ttl is accepted.
    let key = unique_key("extremes");
    let guard = lock(&a, &key)
        .ttl(dlock::MAX_TTL)
        .wait(Duration::MAX)
        .acquire()
        .await
        .expect("a free key with the longest ttl and an endless wait");
    // On a held key the endless wait is a wait (on MySQL the server's own,
    // `GET_LOCK` for the longest it takes), served when the holder lets go.
    let b = fixture.backend().await;
    let endless = lock(&b, &key).wait(Duration::MAX);
    let waiter = tokio::spawn(async move { endless.acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "an endless wait on a held key ended");
    guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("an endless wait not served 5 s after the release")
        .unwrap()
        .expect("an endless wait on a held key");
    next.release().await.unwrap();
}

/// The shortest ttl (`dlock::MIN_TTL`, 30 ms) is a working lease: acquired
/// with a fence, released cleanly, and a leaked one frees within a second.
pub async fn the_shortest_ttl_works<F: Fixture>(fixture: &F) {
    let key = unique_key("shortest");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let guard = lock(&a, &key).ttl(dlock::MIN_TTL).acquire().await.unwrap();
    assert_eq!(guard.fencing_token().is_some(), fixture.fencing());
    match guard.release().await {
        // Under load a 30 ms lease may lapse before its release: that is
        // the lease doing its job, not an error.
        Ok(()) | Err(LockError::NotHeld { .. }) => {}
        Err(e) => panic!("release of a 30 ms lease: {e}"),
    }
    let leaked = lock(&a, &key)
        .ttl(dlock::MIN_TTL)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(leaked);
    // etcd leases are whole seconds on the server (at least its minimum);
    // the others end at the ttl.
    let next = lock(&b, &key)
        .wait(fixture.short_ttl() * 3 + Duration::from_secs(3))
        .acquire()
        .await
        .expect("a leaked 30 ms lease never expired");
    next.release().await.unwrap();
}

/// The registry name of [`the_attribute_holds_the_lock_for_its_body`]'s
/// backend; the case holds [`ATTRIBUTE_TURN`] while it is registered, since
/// a test binary may run the suite on several fixtures at once.
const ATTRIBUTE_BACKEND: &str = "dlock-tests-conformance-attribute";
static ATTRIBUTE_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `#[distributed_lock]` on a function: 8 tasks × 5 calls for one key never
/// run two bodies at once, another client cannot take the key while a body
/// runs, and the key is free again after the last call returns.
pub async fn the_attribute_holds_the_lock_for_its_body<F: Fixture>(fixture: &F) {
    #[dlock::distributed_lock(
        key = "{key}",
        ttl = "10s",
        wait = "60s",
        backend = "dlock-tests-conformance-attribute"
    )]
    async fn body(
        key: String,
        detector: Arc<OverlapDetector>,
        other: Arc<dyn LockBackend>,
        guard: &LockGuard,
    ) -> Result<(), LockError> {
        detector.enter();
        assert!(guard.is_held(), "the body runs without its lease");
        let taken = lock(&other, &key).try_acquire().await?;
        assert!(taken.is_none(), "another client took {key} during the body");
        tokio::task::yield_now().await;
        detector.leave();
        Ok(())
    }

    let _turn = ATTRIBUTE_TURN.lock().await;
    let key = unique_key("attribute");
    let other = fixture.backend().await;
    dlock::registry().register(ATTRIBUTE_BACKEND, fixture.backend().await);
    let detector = Arc::new(OverlapDetector::default());
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (key, detector, other) = (key.clone(), detector.clone(), other.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                body(key.clone(), detector.clone(), other.clone())
                    .await
                    .expect("a call of the attributed function");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a caller panicked");
    }
    dlock::registry().unregister(ATTRIBUTE_BACKEND);
    assert_eq!(detector.overlaps(), 0, "two bodies ran at once");
    let after = lock(&other, &key).try_acquire().await.unwrap();
    assert!(after.is_some(), "the key is still held after the last call");
}
