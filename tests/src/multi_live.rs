//! Multi-key cases of the hand-over rule: a `MultiLock` hands over a guard,
//! and a `keys = [..]` body starts, only while every key's lease is live.
//!
//! The scenario of each case: the acquisition takes its first key and waits
//! for the second, held by a blocker; meanwhile its first key lapses (renewal
//! off, the ttl runs out) or is lost (stolen, then a renewal is refused), and
//! a thief takes it. When the blocker lets the second key go, the
//! acquisition must not come back with the first key the thief holds: it
//! gives everything back and starts over, and succeeds only after the thief
//! has let go, with a greater fence on that key.
//!
//! On a single Redis server (one script for every key) nothing is held while
//! waiting, so the thief simply gets the first key at once: the same
//! assertions hold.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::{distributed_lock, Lock, LockBackend, LockError, MultiLock};

use crate::conformance::{unique_key, Fixture};

/// How the acquisition's first key stops being live while it waits.
#[derive(Debug, Clone, Copy)]
enum Lapse {
    /// Renewal off: the ttl runs out.
    Expires,
    /// Renewal on: an operator deletes the key, the next renewal is refused.
    Stolen,
}

/// Runs the scenario around `acquire` (a `MultiLock` or a macro call that
/// takes `[first, second]`), which reports whether the thief held the first
/// key when it came back, and its fence on that key.
async fn scenario<F, A, Fut>(fixture: &F, lapse: Lapse, ttl: Duration, acquire: A)
where
    F: Fixture,
    A: FnOnce(Arc<dyn LockBackend>, String, String, Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = Result<(bool, Option<u64>), LockError>> + Send + 'static,
{
    let base = unique_key("multi-live");
    let (first, second) = (format!("{base}:a"), format!("{base}:b"));
    let (ours, blocker, thief) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let in_the_way = Lock::new(&second)
        .with_backend(blocker)
        .acquire()
        .await
        .expect("the blocker takes the second key");
    // Taking every key in one call, it holds none while it waits.
    let holds_while_waiting = ours.all_keys().is_none();
    let thief_holds = Arc::new(AtomicBool::new(false));
    let taking = tokio::spawn(acquire(
        ours,
        first.clone(),
        second.clone(),
        thief_holds.clone(),
    ));
    // The acquisition takes the first key (key by key) and waits.
    tokio::time::sleep(ttl / 4).await;
    if let (Lapse::Stolen, true) = (lapse, holds_while_waiting) {
        fixture.steal(&first).await;
    }
    // The thief gets the first key once it lapsed (or at once, stolen).
    let stolen = Lock::new(&first)
        .with_backend(thief)
        .ttl(ttl)
        .wait(ttl * 4)
        .acquire()
        .await
        .expect("the thief takes the first key once it lapsed");
    thief_holds.store(true, Ordering::SeqCst);
    // Long enough for a renewal of the stolen key to be refused.
    tokio::time::sleep(ttl).await;
    in_the_way.release().await.expect("the blocker lets go");
    // The acquisition now has its second key; it must not come back while
    // the thief holds the first.
    tokio::time::sleep(ttl / 2).await;
    assert!(
        !taking.is_finished(),
        "the acquisition came back while the thief held its first key: {:?}",
        taking.await
    );
    let thief_fence = stolen.fencing_token();
    thief_holds.store(false, Ordering::SeqCst);
    stolen.release().await.expect("the thief lets go");
    let (thief_held_then, fence) = tokio::time::timeout(ttl * 10, taking)
        .await
        .expect("the acquisition did not finish after the thief let go")
        .expect("the acquiring task panicked")
        .expect("the acquisition succeeds once both keys are free");
    assert!(
        !thief_held_then,
        "handed over while the thief held the first key"
    );
    if let (Some(thief), Some(ours)) = (thief_fence, fence) {
        assert!(
            ours > thief,
            "the first key's fence {ours} is not above the thief's {thief}"
        );
    }
}

/// A `MultiLock` with renewal off whose first key expires while it waits
/// for the second, and is taken by another client, does not return that
/// key: it starts over and succeeds once the other client let go.
pub async fn a_key_that_lapses_while_waiting_is_not_handed_over<F: Fixture>(fixture: &F) {
    lapsed_key_not_handed_over(fixture, Lapse::Expires).await;
}

/// The same with renewal on: the first key is deleted behind the holder's
/// back (its next renewal is refused) and taken by another client.
pub async fn a_key_lost_while_waiting_is_not_handed_over<F: Fixture>(fixture: &F) {
    lapsed_key_not_handed_over(fixture, Lapse::Stolen).await;
}

/// The scenario of the two cases above, the first key lapsing as `lapse`
/// says (which says whether renewal is on).
async fn lapsed_key_not_handed_over<F: Fixture>(fixture: &F, lapse: Lapse) {
    let renew = matches!(lapse, Lapse::Stolen);
    let ttl = fixture.short_ttl().max(Duration::from_millis(500));
    scenario(
        fixture,
        lapse,
        ttl,
        move |backend, first, second, thief_holds| async move {
            take_both(backend, first, second, thief_holds, ttl, renew).await
        },
    )
    .await;
}

async fn take_both(
    backend: Arc<dyn LockBackend>,
    first: String,
    second: String,
    thief_holds: Arc<AtomicBool>,
    ttl: Duration,
    renew: bool,
) -> Result<(bool, Option<u64>), LockError> {
    let guard = MultiLock::new([first.clone(), second])
        .with_backend(backend)
        .ttl(ttl)
        .renew(renew)
        .wait(ttl * 12)
        .acquire()
        .await?;
    let thief_held = thief_holds.load(Ordering::SeqCst);
    assert!(guard.is_held(), "handed over a guard that is not held");
    let fence = guard
        .fencing_tokens()
        .into_iter()
        .find(|(key, _)| *key == first)
        .and_then(|(_, fence)| fence);
    guard.release().await?;
    Ok((thief_held, fence))
}

/// The registry name the macro case uses (one such case per test binary).
const MACRO_BACKEND: &str = "dlock-tests-multi-live";

/// Through `#[distributed_lock(keys = [..])]`, renewal off: the body never
/// starts while another client holds a key whose lease lapsed.
pub async fn a_body_never_starts_with_a_lapsed_key<F: Fixture>(fixture: &F) {
    #[distributed_lock(
        keys = ["{first}", "{second}"],
        ttl = "1s",
        renew = false,
        wait = "12s",
        backend = "dlock-tests-multi-live"
    )]
    async fn body(
        first: String,
        second: String,
        thief_holds: Arc<AtomicBool>,
    ) -> Result<bool, LockError> {
        // Before any `.await`: what the body does first.
        Ok(thief_holds.load(Ordering::SeqCst))
    }

    let ttl = Duration::from_secs(1);
    scenario(
        fixture,
        Lapse::Expires,
        ttl,
        move |backend, first, second, thief_holds| {
            dlock::registry().register(MACRO_BACKEND, backend);
            async move {
                let thief_held = body(first, second, thief_holds).await?;
                Ok((thief_held, None))
            }
        },
    )
    .await;
    dlock::registry().unregister(MACRO_BACKEND);
}
