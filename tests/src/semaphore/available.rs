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

/// `Semaphore::inspect` and `list_semaphores` show the holders (a name
/// or a server session for each), their counts and the stored count, and
/// nothing once every permit is back; they take nothing themselves.
pub async fn inspect_shows_holders_and_counts<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-inspect");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let free = semaphore(&b, &name, 5).inspect().await.unwrap();
    assert_eq!((free.permits, free.held()), (None, 0), "{free:?}");

    let many = a.permits().is_some_and(|p| p.many_permits());
    let first = if many {
        semaphore(&a, &name, 5).acquire_many(3).await.unwrap()
    } else {
        semaphore(&a, &name, 5).acquire().await.unwrap()
    };
    let second = semaphore(&b, &name, 5).acquire().await.unwrap();
    let expected = if many { 4 } else { 2 };
    for reader in [&a, &b] {
        let info = semaphore(reader, &name, 5).inspect().await.unwrap();
        assert_eq!(info.permits, Some(5), "{info:?}");
        assert_eq!(info.held(), expected, "{info:?}");
        assert_eq!(info.available(), Some(5 - expected), "{info:?}");
        assert!(
            info.holders
                .iter()
                .all(|h| h.holder.is_some() || h.session.is_some()),
            "every holder is named or shown by its server session: {info:?}"
        );
        // Another count is shown, not refused: the server's count wins.
        let other = semaphore(reader, &name, 2).inspect().await.unwrap();
        assert_eq!(other.permits, Some(5), "{other:?}");
    }
    assert_eq!(
        free_after_reads(&b, &name).await,
        5 - expected,
        "inspect took nothing"
    );

    let prefix = &name[..name.len() - 4];
    match dlock::list_semaphores(&*b, prefix).await {
        Ok(found) => {
            let ours: Vec<_> = found.iter().filter(|(n, _)| *n == name).collect();
            assert_eq!(ours.len(), 1, "listed once: {found:?}");
            assert_eq!(ours[0].1.held(), expected, "{found:?}");
            assert!(
                found.iter().all(|(n, _)| n.starts_with(prefix)),
                "{found:?}"
            );
        }
        Err(LockError::InvalidOption { reason }) if b.describe().starts_with("postgres") => {
            assert!(reason.contains("inspect one by name"), "{reason}");
        }
        Err(e) => panic!("list_semaphores: {e}"),
    }

    first.release().await.unwrap();
    second.release().await.unwrap();
    let after = semaphore(&a, &name, 5).inspect().await.unwrap();
    assert!(after.holders.is_empty(), "every permit is back: {after:?}");
    if let Ok(found) = dlock::list_semaphores(&*a, &name).await {
        assert!(
            found.is_empty(),
            "a semaphore without holders is not listed: {found:?}"
        );
    }
}

async fn free_after_reads(backend: &Arc<dyn LockBackend>, name: &str) -> usize {
    free(backend, name, 5).await
}
