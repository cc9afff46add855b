//! The cases the lock suite and the semaphore suite share, written once over
//! [`Take`] and run by both suites through one list,
//! [`shared_suite!`](crate::shared_suite).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError, LockGuard, Permit, Semaphore};

use crate::conformance::{unique_key, Fixture};

/// Expands to one `#[tokio::test]` per shared case, taking what `$take`
/// names. `conformance_suite!` runs them on locks, `semaphore_suite!` on a
/// semaphore of one permit.
#[macro_export]
macro_rules! shared_suite {
    ($fixture:expr, $take:expr) => {
        $crate::shared_suite!(@cases $fixture, $take;
            zero_wait_is_busy,
            wait_times_out_on_time,
            leaked_lease_expires_after_ttl,
            renewal_keeps_the_lease_past_three_ttls,
            a_wait_dropped_as_its_turn_comes_is_given_back,
        );
    };
    (@cases $fixture:expr, $take:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $fixture;
                $crate::shared::$case(&fixture, $take).await;
            }
        )*
    };
}

/// What a shared case takes on its key.
#[derive(Debug, Clone, Copy)]
pub enum Take {
    /// A lock on the key.
    Lock,
    /// The one permit of a one-permit semaphore named after the key.
    Permit,
}

/// A lock or a one-permit semaphore, with the options a case sets.
#[derive(Clone)]
enum Taker {
    Lock(Lock),
    Semaphore(Semaphore),
}

/// A held lock or permit.
enum Held {
    Guard(LockGuard),
    Permit(Permit),
}

impl Take {
    fn on(self, backend: &Arc<dyn LockBackend>, key: &str) -> Taker {
        match self {
            Take::Lock => Taker::Lock(Lock::new(key).with_backend(backend.clone())),
            Take::Permit => Taker::Semaphore(Semaphore::new(key, 1).with_backend(backend.clone())),
        }
    }

    /// A key of its own for `case`.
    fn key(self, case: &str) -> String {
        match self {
            Take::Lock => unique_key(case),
            Take::Permit => unique_key(&format!("semaphore-{case}")),
        }
    }

    /// "lease" or "permit", for messages.
    fn noun(self) -> &'static str {
        match self {
            Take::Lock => "lease",
            Take::Permit => "permit",
        }
    }
}

impl Taker {
    fn ttl(self, ttl: Duration) -> Self {
        match self {
            Taker::Lock(l) => Taker::Lock(l.ttl(ttl)),
            Taker::Semaphore(s) => Taker::Semaphore(s.ttl(ttl)),
        }
    }

    fn wait(self, wait: Duration) -> Self {
        match self {
            Taker::Lock(l) => Taker::Lock(l.wait(wait)),
            Taker::Semaphore(s) => Taker::Semaphore(s.wait(wait)),
        }
    }

    fn renew(self, renew: bool) -> Self {
        match self {
            Taker::Lock(l) => Taker::Lock(l.renew(renew)),
            Taker::Semaphore(s) => Taker::Semaphore(s.renew(renew)),
        }
    }

    async fn acquire(&self) -> Result<Held, LockError> {
        match self {
            Taker::Lock(l) => l.acquire().await.map(Held::Guard),
            Taker::Semaphore(s) => s.acquire().await.map(Held::Permit),
        }
    }

    async fn try_acquire(&self) -> Result<Option<Held>, LockError> {
        match self {
            Taker::Lock(l) => Ok(l.try_acquire().await?.map(Held::Guard)),
            Taker::Semaphore(s) => Ok(s.try_acquire().await?.map(Held::Permit)),
        }
    }
}

impl Held {
    fn is_held(&self) -> bool {
        match self {
            Held::Guard(g) => g.is_held(),
            Held::Permit(p) => p.is_held(),
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Permit(p) => p.release().await,
        }
    }
}

pub async fn zero_wait_is_busy<F: Fixture>(fixture: &F, take: Take) {
    let key = take.key("busy");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let _held = take.on(&a, &key).acquire().await.unwrap();
    let err = take
        .on(&b, &key)
        .wait(Duration::ZERO)
        .acquire()
        .await
        .err()
        .expect("a zero wait on a held key succeeded");
    assert!(
        matches!(err, LockError::Busy { key: ref k } if *k == key),
        "{err:?}"
    );
}

pub async fn wait_times_out_on_time<F: Fixture>(fixture: &F, take: Take) {
    let key = take.key("timeout");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let _held = take.on(&a, &key).acquire().await.unwrap();
    let wait = Duration::from_millis(400);
    let start = Instant::now();
    let err = take
        .on(&b, &key)
        .wait(wait)
        .acquire()
        .await
        .err()
        .expect("a wait on a held key succeeded");
    let took = start.elapsed();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(took >= wait, "gave up early, after {took:?}");
    assert!(
        took < wait + Duration::from_secs(1),
        "gave up late, after {took:?}"
    );
}

/// A lease that is never given back (its process "crashed") stops blocking
/// others once its ttl runs out. Renewal is off: a leaked guard with renewal
/// on is indistinguishable from a long critical section.
pub async fn leaked_lease_expires_after_ttl<F: Fixture>(fixture: &F, take: Take) {
    let key = take.key("leak");
    let noun = take.noun();
    let ttl = fixture.short_ttl();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let leaked = take
        .on(&a, &key)
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let start = Instant::now();
    std::mem::forget(leaked);
    let next = take
        .on(&b, &key)
        .wait(ttl * 3 + Duration::from_secs(2))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("the leaked {noun} never expired: {e}"));
    let took = start.elapsed();
    assert!(
        took + ttl / 10 >= ttl,
        "taken over after {took:?}, before the ttl {ttl:?} ran out"
    );
    assert!(
        took <= ttl * 2 + Duration::from_secs(1),
        "leaked {noun} lasted {took:?}"
    );
    next.release().await.unwrap();
}

pub async fn renewal_keeps_the_lease_past_three_ttls<F: Fixture>(fixture: &F, take: Take) {
    let key = take.key("renew");
    let noun = take.noun();
    let ttl = fixture.short_ttl();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let held = take.on(&a, &key).ttl(ttl).acquire().await.unwrap();
    tokio::time::sleep(ttl * 3 + ttl / 2).await;
    assert!(held.is_held(), "the watchdog let the {noun} lapse");
    assert!(take.on(&b, &key).try_acquire().await.unwrap().is_none());
    held.release().await.expect("still ours after 3.5 ttls");
}

/// Rounds of [`a_wait_dropped_as_its_turn_comes_is_given_back`] in the
/// shared suites (MySQL's own test runs more).
const TURN_ROUNDS: u32 = 40;

/// A wait dropped just as its turn comes: the holder's release and the
/// waiter's drop at once, either one later by 0 to 1 ms. Whatever the
/// dropped wait was given meanwhile is given back, and the next taker is
/// served within a second or two. (On MySQL a cancel's `KILL QUERY` that
/// landed between two statements of the waiter's request left the lock
/// held until the session was closed, three seconds later.)
pub async fn a_wait_dropped_as_its_turn_comes_is_given_back<F: Fixture>(fixture: &F, take: Take) {
    turns_dropped(fixture, take, TURN_ROUNDS).await;
}

/// [`a_wait_dropped_as_its_turn_comes_is_given_back`] over `rounds`
/// rounds; prints how many dropped waits had been granted first.
pub async fn turns_dropped<F: Fixture>(fixture: &F, take: Take, rounds: u32) {
    let noun = take.noun();
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let mut granted_first = 0;
    for round in 0..rounds {
        let key = take.key(&format!("turn-drop-{round}"));
        let held = take.on(&a, &key).acquire().await.unwrap();
        let waiter = take.on(&b, &key).wait(Duration::from_secs(10));
        let wait = tokio::spawn(async move { waiter.acquire().await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let shift = Duration::from_micros(u64::from(round % 40) * 25);
        let (release_after, drop_after) = if round % 80 < 40 {
            (Duration::ZERO, shift)
        } else {
            (shift, Duration::ZERO)
        };
        let (released, ()) = tokio::join!(
            async {
                tokio::time::sleep(release_after).await;
                held.release().await
            },
            async {
                tokio::time::sleep(drop_after).await;
                wait.abort();
            }
        );
        released.unwrap();
        // Granted before the drop: an ordinary holder, released here.
        if let Ok(Ok(first)) = wait.await {
            granted_first += 1;
            first.release().await.unwrap();
        }
        let started = Instant::now();
        let next = take
            .on(&c, &key)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(2),
            "round {round}: the next {noun} waited {waited:?} behind a dropped wait"
        );
        next.release().await.unwrap();
    }
    println!("{noun} waits granted before their drop: {granted_first} of {rounds}");
}
