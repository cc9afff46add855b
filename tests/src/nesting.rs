//! Keys and semaphore names that nest by `/` (`tenant/7`, `tenant/7/order`)
//! name independent locks and semaphores on every backend: `/` is an
//! ordinary character of a key, not a path separator.

use std::sync::Arc;

use dlock::backend::no_semaphores;
use dlock::{LockBackend, Semaphore};

use crate::conformance::{lock, unique_key, Fixture};

/// Holding `<unique>/7/order` does not keep another client from
/// `try_acquire` of `<unique>/7`, nor the reverse; each stays exclusive. On
/// backends with semaphores, one permit held of `<unique>/exports` (one
/// permit) does not block `<unique>/exports/big`, nor the reverse.
pub async fn nested_keys_are_independent<F: Fixture>(fixture: &F) {
    let base = unique_key("nesting");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let (parent, child) = (format!("{base}/7"), format!("{base}/7/order"));
    for (held, other) in [(&child, &parent), (&parent, &child)] {
        let guard = lock(&a, held).acquire().await.unwrap();
        let taken = lock(&b, other).try_acquire().await.unwrap();
        assert!(taken.is_some(), "holding `{held}` kept `{other}` busy");
        assert!(
            lock(&b, held).try_acquire().await.unwrap().is_none(),
            "`{held}` was taken twice"
        );
        assert!(
            lock(&a, other).try_acquire().await.unwrap().is_none(),
            "`{other}` was taken twice"
        );
        taken.unwrap().release().await.unwrap();
        guard.release().await.unwrap();
    }

    let (parent, child) = (format!("{base}/exports"), format!("{base}/exports/big"));
    let semaphore = |backend: &Arc<dyn LockBackend>, name: &str| {
        Semaphore::new(name, 1).with_backend(backend.clone())
    };
    for (held, other) in [(&parent, &child), (&child, &parent)] {
        let permit = match semaphore(&a, held).try_acquire().await {
            // Semaphores are opt-in (see `semaphore_suite!`): nothing to check.
            Err(e) if e.to_string() == no_semaphores(&a.describe()).to_string() => return,
            outcome => outcome.unwrap().expect("a free permit"),
        };
        let taken = semaphore(&b, other).try_acquire().await.unwrap();
        assert!(
            taken.is_some(),
            "a permit of `{held}` kept semaphore `{other}` full"
        );
        assert!(
            semaphore(&b, held).try_acquire().await.unwrap().is_none(),
            "semaphore `{held}` admitted two with one permit"
        );
        taken.unwrap().release().await.unwrap();
        permit.release().await.unwrap();
    }
}
