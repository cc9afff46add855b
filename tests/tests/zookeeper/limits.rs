//! Extreme ttls and deadlines: the clamp to the session, unbounded values, the longest ones.

use super::*;

/// The ttl of a lease is clamped to 11/20 of the negotiated session timeout:
/// the ensemble's leader may have heard of the session's last request up to
/// 9/20 of the timeout later than the request (see the module docs), and a
/// longer local deadline could outlive a session it already expired. A ttl
/// within the bound is kept, and a renewal keeps the clamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_is_clamped_to_eleven_twentieths_of_the_session_timeout() {
    let fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    assert_eq!(b.session_timeout(), SESSION_TIMEOUT);
    let most = SESSION_TIMEOUT / 20 * 11;
    let backend: Arc<dyn LockBackend> = b.clone();
    for (key, ttl, expected) in [
        ("clamp-long", Duration::from_secs(60), most),
        (
            "clamp-short",
            Duration::from_secs(1),
            Duration::from_secs(1),
        ),
    ] {
        let req = dlock::backend::AcquireRequest {
            key: key.into(),
            token: "00112233445566778899aabbccddeeff".into(),
            ttl,
        };
        // With the key's directory in place, the acquisition is one create,
        // the request its lease is counted from. (The first on a new key is
        // refused for want of the directory, creates it, and counts from the
        // create that follows, later than `sent` below.)
        fixture
            .admin()
            .mkdir(
                &fixture.lock_path(key),
                &zookeeper_client::CreateMode::Persistent
                    .with_acls(zookeeper_client::Acls::anyone_all()),
            )
            .await
            .unwrap();
        let sent = Instant::now();
        let lease = backend.try_acquire(&req).await.unwrap().expect("free key");
        assert_eq!(lease.ttl, expected, "{key}");
        assert!(lease.valid_until <= sent + expected, "{key}");
        let sent = Instant::now();
        let renewed = backend.renew(std::slice::from_ref(&lease)).await;
        let Ok(dlock::backend::Renewal::Renewed { valid_until }) = renewed[0] else {
            panic!("{key}: renewal failed: {renewed:?}");
        };
        assert!(valid_until <= sent + expected, "{key}");
        assert!(backend.release(&lease).await.unwrap(), "{key}");
    }
}

/// The latest `Instant` this platform can represent: a deadline that far
/// away is "no limit" in all but name.
fn latest_instant() -> Instant {
    let now = Instant::now();
    let (mut lo, mut hi) = (0u64, u64::MAX);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if now.checked_add(Duration::from_secs(mid)).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let secs = now + Duration::from_secs(lo);
    let (mut lo, mut hi) = (0u32, 999_999_999u32);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if secs.checked_add(Duration::from_nanos(mid.into())).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    secs + Duration::from_nanos(lo.into())
}

/// Values at the edge of `Duration` and `Instant` neither panic nor wrap:
/// a session timeout too long for the protocol's 32-bit milliseconds is an
/// `InvalidOption` that names it; the longest ttl the core takes
/// (`MAX_TTL`) on a lock or a semaphore, and a `Duration::MAX` ttl handed to
/// the backend itself or in a renewed lease, are clamped like any long ttl;
/// a wait deadline at the end of time is no limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_ttls_and_deadlines_neither_panic_nor_wrap() {
    let fixture = ZkFixture::start().await;
    let base = fixture.url().split('?').next().unwrap().to_owned();
    for timeout in [
        "2147483648ms",
        "18446744073709551615ms",
        "18446744073709551615s",
        "99999999999m",
        "2147483648",
    ] {
        let url = format!("{base}?session_timeout={timeout}");
        let err = ZooKeeperBackend::connect(&url).await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidOption { .. }),
            "{url}: {err:?}"
        );
        assert!(err.to_string().contains("session_timeout"), "{url}: {err}");
    }
    let longest = ZooKeeperBackend::connect(&format!("{base}?session_timeout=2147483647ms"))
        .await
        .expect("the longest session timeout the protocol carries");
    drop(longest);

    let b = backend(&fixture).await;
    let most = SESSION_TIMEOUT / 20 * 11;
    // The core refuses a longer ttl on every backend.
    let refused = lock(&b, "forever").ttl(Duration::MAX).acquire().await;
    assert!(
        matches!(refused, Err(LockError::InvalidOption { .. })),
        "{refused:?}"
    );
    let guard = lock(&b, "forever")
        .ttl(MAX_TTL)
        .acquire()
        .await
        .expect("a ttl of MAX_TTL");
    // Renewed like any long lease (every third of the clamped ttl).
    tokio::time::sleep(most).await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let permit = dlock::Semaphore::new("forever-permits", 2)
        .with_backend(b.clone())
        .ttl(MAX_TTL)
        .acquire()
        .await
        .expect("a permit with a ttl of MAX_TTL");
    permit.release().await.unwrap();

    let backend: Arc<dyn LockBackend> = b.clone();
    let end_of_time = Some(latest_instant());
    let req = dlock::backend::AcquireRequest {
        key: "end-of-time".into(),
        token: "00112233445566778899aabbccddeeff".into(),
        ttl: Duration::MAX,
    };
    let lease = backend
        .acquire(&req, end_of_time)
        .await
        .expect("acquire with a deadline at the end of time")
        .expect("a free key");
    assert_eq!(lease.ttl, most);
    let forged = dlock::backend::Lease {
        ttl: Duration::MAX,
        ..lease.clone()
    };
    let sent = Instant::now();
    let renewed = backend.renew(std::slice::from_ref(&forged)).await;
    let Ok(dlock::backend::Renewal::Renewed { valid_until }) = renewed[0] else {
        panic!("renewal of a Duration::MAX lease failed: {renewed:?}");
    };
    assert!(valid_until <= sent + most);
    assert!(backend.release(&lease).await.unwrap());
    let permit_req = dlock::backend::PermitRequest {
        name: "end-of-time".into(),
        permits: 1,
        count: 1,
        token: "00112233445566778899aabbccddeeff".into(),
        ttl: Duration::MAX,
    };
    let permits = backend.permits().expect("ZooKeeper has semaphores");
    let lease = permits
        .acquire_permit(&permit_req, end_of_time)
        .await
        .expect("acquire_permit with a deadline at the end of time")
        .expect("a free permit");
    assert_eq!(lease.ttl, most);
    assert!(permits.release_permit(&lease).await.unwrap());
}

/// The longest ttl and a `Duration::MAX` wait, the natural way to write
/// "hold it and wait for it as long as it takes", on a lock, a semaphore
/// and a segmented lock: success, no panic. (The wait's deadline is the
/// core's: an overflowing one means no limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_ttl_and_wait_work_on_zookeeper() {
    let fixture = ZkFixture::start().await;
    const LONGEST: &str = "ttl MAX_TTL and wait Duration::MAX";
    let b = backend(&fixture).await;
    let lock = lock(&b, "max-wait").ttl(MAX_TTL).wait(Duration::MAX);
    let permits = dlock::Semaphore::new("max-wait-permits", 1)
        .with_backend(b.clone())
        .ttl(MAX_TTL)
        .wait(Duration::MAX);
    let segments = dlock::SegmentedLock::new("max-wait-segments", 2)
        .with_backend(b.clone())
        .ttl(MAX_TTL)
        .wait(Duration::MAX);
    let guard = lock.acquire().await.expect(LONGEST);
    guard.release().await.unwrap();
    let permit = permits.acquire().await.expect(LONGEST);
    permit.release().await.unwrap();
    let segment = segments.acquire().await.expect(LONGEST);
    segment.release().await.unwrap();
}

// ---------------------------------------------------------------- Curator
