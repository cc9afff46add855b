//! The operator's cases of the conformance suite, on every backend:
//! `Lock::inspect`, `Lock::force_release`, `dlock::list_locks`,
//! `LockGuard::remaining` and `LockGuard::extend`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockBackend, LockError, LockGuard};

use crate::conformance::{lock, unique_key, Fixture};

/// A lease on `key` with `ttl` and renewal off: it lasts its ttl, or what
/// `extend` gives it.
async fn hard_lease(backend: &Arc<dyn LockBackend>, key: &str, ttl: Duration) -> LockGuard {
    lock(backend, key)
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap()
}

/// Free: `None`. Held: the holder's client name (never its token), time left
/// within the ttl, the guard's fence; `remaining()` goes down while a
/// lease is not renewed.
pub async fn inspect_shows_the_holder<F: Fixture>(fixture: &F) {
    let key = unique_key("inspect");
    // Whole seconds, so an etcd lease is granted exactly this; a ZooKeeper
    // node reports its session timeout (4 s in the fixture), below it.
    let ttl = Duration::from_secs(5);
    let a = fixture.backend().await;
    let b = fixture.backend().await;
    assert_eq!(lock(&b, &key).inspect().await.unwrap(), None, "free");
    let guard = hard_lease(&a, &key, ttl).await;
    let info = lock(&b, &key)
        .inspect()
        .await
        .unwrap()
        .expect("held, seen by another client");
    assert_eq!(info.holder.as_deref(), a.client_name());
    assert!(
        info.holder
            .as_deref()
            .is_some_and(|h| !h.contains(guard.token())),
        "{info:?}"
    );
    assert!(info.remaining <= ttl, "{info:?}");
    assert!(info.remaining > Duration::ZERO, "{info:?}");
    assert_eq!(info.fencing_token, guard.fencing_token());
    // ZooKeeper caps a lease at 11/20 of its session timeout.
    let first = guard.remaining();
    assert!(first <= ttl && first > Duration::ZERO, "{first:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(guard.remaining() < first, "remaining() did not go down");
    guard.release().await.unwrap();
    assert_eq!(lock(&b, &key).inspect().await.unwrap(), None, "released");
}

/// A forced release frees the key whoever holds it: the holder's `lost()`
/// fires at its next renewal, the next holder's fence is greater, and a
/// second forced release finds nothing.
pub async fn force_release_evicts_the_holder<F: Fixture>(fixture: &F) {
    let key = unique_key("force");
    let ttl = fixture.short_ttl();
    let a = fixture.backend().await;
    let operator = fixture.backend().await;
    let evicted = lock(&a, &key).ttl(ttl).acquire().await.unwrap();
    let lost = evicted.lost();
    assert!(lock(&operator, &key).force_release().await.unwrap());
    let bound = ttl + Duration::from_secs(2);
    tokio::time::timeout(bound, lost)
        .await
        .unwrap_or_else(|_| panic!("the evicted guard's lost() did not fire within {bound:?}"));
    let next = lock(&operator, &key)
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("free after the forced release");
    if fixture.fencing() {
        assert!(
            next.fencing_token() > evicted.fencing_token(),
            "{:?} after {:?}",
            next.fencing_token(),
            evicted.fencing_token()
        );
    }
    let err = evicted.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
    next.release().await.unwrap();
    assert!(!lock(&operator, &key).force_release().await.unwrap());
}

/// `extend` lengthens a lease taken with `renew(false)` past its ttl.
pub async fn extend_lengthens_a_hard_lease<F: Fixture>(fixture: &F) {
    let key = unique_key("extend");
    let ttl = fixture.short_ttl();
    let a = fixture.backend().await;
    let start = Instant::now();
    let guard = hard_lease(&a, &key, ttl).await;
    tokio::time::sleep(ttl / 2).await;
    guard.extend(ttl * 3).await.expect("extend");
    tokio::time::sleep_until((start + ttl + ttl / 3).into()).await;
    assert!(guard.is_held(), "lost past the original ttl after extend");
    let other = fixture.backend().await;
    assert!(
        lock(&other, &key).try_acquire().await.unwrap().is_none(),
        "another client took the extended key"
    );
    guard.release().await.unwrap();
    let err = lock(&a, &key)
        .acquire()
        .await
        .unwrap()
        .extend(Duration::ZERO)
        .await;
    assert!(
        matches!(err, Err(LockError::InvalidOption { .. })),
        "{err:?}"
    );
}

/// `list_locks` shows exactly the held lock keys under a prefix, each as
/// `inspect` shows it (escaped characters included), not a released key,
/// a key outside the prefix, a semaphore or a read-write lock of the name;
/// a prefix no key can start with is `InvalidKey`.
pub async fn list_shows_the_held_keys<F: Fixture>(fixture: &F) {
    let base = unique_key("list");
    let ttl = Duration::from_secs(10);
    let a = fixture.backend().await;
    let operator = fixture.backend().await;
    let prefix = format!("{base}:");
    let one = format!("{prefix}one");
    // `/`, `%` and braces: escaped by etcd, ZooKeeper and Redis.
    let odd = format!("{prefix}a/b%25{{c}}");
    let gone = format!("{prefix}gone");
    let outside = format!("{base}-outside");
    assert_eq!(
        dlock::list_locks(&*operator, &prefix).await.unwrap(),
        vec![],
        "nothing held yet"
    );
    let mut guards = Vec::new();
    for key in [&one, &odd, &gone, &outside] {
        guards.push(lock(&a, key).ttl(ttl).acquire().await.unwrap());
    }
    let released = guards.remove(2);
    released.release().await.unwrap();
    // Other kinds of lease of a listed name are not locks.
    let _permit = match a.permits() {
        Some(_) => dlock::Semaphore::new(format!("{prefix}sem"), 2)
            .with_backend(a.clone())
            .try_acquire()
            .await
            .ok()
            .flatten(),
        None => None,
    };
    let _read = match a.rw() {
        Some(_) => dlock::RwLock::new(format!("{prefix}rw"))
            .with_backend(a.clone())
            .try_read()
            .await
            .ok()
            .flatten(),
        None => None,
    };

    let listed = dlock::list_locks(&*operator, &prefix).await.unwrap();
    let keys: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
    let mut expected = vec![odd.as_str(), one.as_str()];
    expected.sort();
    assert_eq!(keys, expected, "{listed:?}");
    for ((key, info), guard) in listed.iter().zip([&guards[1], &guards[0]]) {
        assert_eq!(key, guard.key());
        assert_eq!(info.holder.as_deref(), a.client_name(), "{key}: {info:?}");
        assert_eq!(info.fencing_token, guard.fencing_token(), "{key}");
        assert!(
            info.remaining > Duration::ZERO && info.remaining <= ttl,
            "{info:?}"
        );
        assert_eq!(
            lock(&operator, key)
                .inspect()
                .await
                .unwrap()
                .map(|i| i.holder),
            Some(info.holder.clone())
        );
    }
    // The whole namespace holds ours too (other cases may hold more).
    let all = dlock::list_locks(&*operator, "").await.unwrap();
    for key in [&one, &odd, &outside] {
        assert!(
            all.iter().any(|(k, _)| k == key),
            "{key} missing from {all:?}"
        );
    }
    // A longer prefix narrows; a prefix that matches nothing lists nothing.
    let narrowed = dlock::list_locks(&*operator, &one).await.unwrap();
    assert_eq!(narrowed.len(), 1, "{narrowed:?}");
    assert!(dlock::list_locks(&*operator, &format!("{base}:none"))
        .await
        .unwrap()
        .is_empty());
    let err = dlock::list_locks(&*operator, "bad\u{7}prefix")
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");

    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(
        dlock::list_locks(&*operator, &prefix).await.unwrap(),
        vec![],
        "released"
    );
}
