//! The semaphore suite's `available()` case with single permits, run on
//! every backend (the weighted ones in `many.rs` run only where several
//! permits are taken at once).

use std::sync::Arc;

use dlock::{LockBackend, LockError, Semaphore};

use crate::conformance::{unique_key, Fixture};

fn semaphore(backend: &Arc<dyn LockBackend>, name: &str, permits: usize) -> Semaphore {
    Semaphore::new(name, permits).with_backend(backend.clone())
}

async fn free(backend: &Arc<dyn LockBackend>, name: &str, permits: usize) -> usize {
    semaphore(backend, name, permits)
        .available()
        .await
        .expect("available() reads the semaphore")
}

/// `available()` read from a second client follows every acquire and
/// release of a first (3 → 0 → 3), reads another count while a permit is
/// out as the typed refusal naming both numbers, and takes nothing itself
/// (a try after it still gets the last permit).
pub async fn available_follows_single_permits<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-available");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    assert_eq!(free(&b, &name, 3).await, 3, "nobody holds a permit yet");
    let first = semaphore(&a, &name, 3).acquire().await.unwrap();
    assert_eq!(free(&b, &name, 3).await, 2);
    let second = semaphore(&b, &name, 3).acquire().await.unwrap();
    assert_eq!(free(&a, &name, 3).await, 1);
    for _ in 0..3 {
        assert_eq!(free(&b, &name, 3).await, 1, "reading took a permit");
    }
    let third = semaphore(&a, &name, 3)
        .try_acquire()
        .await
        .unwrap()
        .expect("the last permit is free after the reads");
    assert_eq!(free(&b, &name, 3).await, 0);

    let err = semaphore(&b, &name, 2).available().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("has 3 permits on the server, this caller asked for 2"),
        "{text}"
    );

    second.release().await.unwrap();
    assert_eq!(free(&a, &name, 3).await, 1);
    first.release().await.unwrap();
    third.release().await.unwrap();
    assert_eq!(free(&b, &name, 3).await, 3, "every permit is back");
    assert_eq!(
        free(&b, &name, 2).await,
        2,
        "no count is stored once all are back"
    );
}
