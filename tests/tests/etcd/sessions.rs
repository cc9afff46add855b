//! One session for many guards: keys deleted among many held, runtimes that end, extreme ttls, idle leases revoked.

use super::*;
use crate::deeper_keys::raw_client;

/// 100 guards of one backend share its session lease: one keep-alive and a
/// read of 100 keys (in two transactions) per renewal keep all of them held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_guards_share_one_session_and_stay_held() {
    let fixture = EtcdFixture::single();
    let backend = connect(fixture.url()).await;
    let ttl = Duration::from_secs(1);
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(
            lock(&backend, &format!("many:{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let leases = blocking(|| fixture.etcdctl(&["lease", "list"]));
    assert!(leases.contains("found 1 leases"), "{leases}");
    tokio::time::sleep(ttl * 3 + ttl / 2).await;
    assert!(guards.iter().all(|g| g.is_held()), "a guard lapsed");
    let other = connect(fixture.url()).await;
    assert!(lock(&other, "many:99")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert!(lock(&other, "many:99")
        .try_acquire()
        .await
        .unwrap()
        .is_some());
}

/// Past 128 keys a renewal checks the held keys through one watch of the
/// namespace's deletes instead of reading each (`deletions.rs`): a lock key and
/// a read lease's key deleted behind their holders' backs among 150 of each are
/// reported lost in time, and no other lease is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_deleted_among_many_held_are_lost_and_no_other() {
    use dlock_tests::conformance::Fixture;
    use dlock_tests::rw::RwFixture;
    const EACH: usize = 150;
    let fixture = EtcdFixture::single();
    let backend = connect(fixture.url()).await;
    let ttl = Duration::from_secs(2);
    let locks = futures_util::future::join_all((0..EACH).map(|i| {
        let lock = lock(&backend, &format!("watched:{i}")).ttl(ttl);
        async move { lock.acquire().await.unwrap() }
    }))
    .await;
    let reads = futures_util::future::join_all((0..EACH).map(|i| {
        let rw = dlock::RwLock::new(format!("watched-rw:{i}"))
            .with_backend(backend.clone())
            .ttl(ttl);
        async move { rw.read().await.unwrap() }
    }))
    .await;
    // Past one renewal, so the watch is running before the deletes.
    tokio::time::sleep(ttl / 2).await;
    fixture.steal("watched:7").await;
    fixture.steal_rw("watched-rw:9").await;
    let bound = ttl + Duration::from_secs(1);
    tokio::time::timeout(bound, locks[7].lost())
        .await
        .unwrap_or_else(|_| panic!("the deleted lock was not lost within {bound:?}"));
    tokio::time::timeout(bound, reads[9].lost())
        .await
        .unwrap_or_else(|_| panic!("the deleted read lease was not lost within {bound:?}"));
    // Two more ttls: every other lease stays held.
    tokio::time::sleep(ttl * 2).await;
    for (i, guard) in locks.iter().enumerate() {
        assert_eq!(guard.is_held(), i != 7, "lock watched:{i}");
    }
    for (i, guard) in reads.iter().enumerate() {
        assert_eq!(guard.is_held(), i != 9, "read lease watched-rw:{i}");
    }
    let other = connect(fixture.url()).await;
    assert!(lock(&other, "watched:7")
        .try_acquire()
        .await
        .unwrap()
        .is_some());
    assert!(lock(&other, "watched:8")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    for guard in locks {
        let _ = guard.release().await;
    }
    for guard in reads {
        let _ = guard.release().await;
    }
}

/// A guard taken in a short-lived current-thread runtime (as a
/// `#[tokio::test]` or a `block_on` helper has) and dropped after that
/// runtime is gone: its release can never run there, yet while another guard
/// keeps the backend's session lease alive, the key must leave the server
/// by its ttl, and the backend must take the key again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_after_its_runtime_ended_frees_the_key_by_its_ttl() {
    let fixture = EtcdFixture::single();
    let ttl = Duration::from_secs(3);
    let (a, b) = (connect(fixture.url()).await, connect(fixture.url()).await);
    // Renewed on this runtime all along: it keeps A's session lease alive.
    let keeper = lock(&a, "runtime-keeper").ttl(ttl).acquire().await.unwrap();
    let leaked = {
        let lock = lock(&a, "runtime-ended").ttl(ttl);
        tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let guard = runtime.block_on(lock.acquire()).unwrap();
            drop(runtime);
            let taken_at = Instant::now();
            drop(guard);
            taken_at
        })
        .await
        .unwrap()
    };
    let limit = ttl + Duration::from_secs(3);
    let taken = loop {
        if let Some(guard) = lock(&b, "runtime-ended").try_acquire().await.unwrap() {
            break guard;
        }
        assert!(
            leaked.elapsed() < limit,
            "another client still could not take the key {:?} after the guard was dropped (ttl {ttl:?})",
            leaked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    taken.release().await.unwrap();
    // Nothing of the dropped guard is left in A either.
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        lock(&a, "runtime-ended")
            .wait(Duration::from_secs(2))
            .acquire(),
    )
    .await
    .expect("A's acquire hung after the dropped guard's key was gone")
    .expect("A could not take the key again");
    assert!(keeper.is_held());
    again.release().await.unwrap();
    keeper.release().await.unwrap();
}

/// `Duration::MAX` as a ttl never overflows in the etcd backend: a lock and
/// a permit are taken, waited for (the waiting path schedules session
/// refreshes from the ttl), renewed and released. Called on the backend
/// directly, so only the backend's own arithmetic is exercised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_of_duration_max_never_overflows() {
    let fixture = EtcdFixture::single();
    let (a, b) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let wait = || Some(Instant::now() + Duration::from_secs(5));

    let lock_request = |token: &str| AcquireRequest {
        key: "forever".into(),
        token: token.into(),
        ttl: Duration::MAX,
    };
    let held = a
        .try_acquire(&lock_request("first"))
        .await
        .unwrap()
        .unwrap();
    let waiting = {
        let (b, request) = (b.clone(), lock_request("second"));
        tokio::spawn(async move { b.acquire(&request, wait()).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let renewed = a.renew(std::slice::from_ref(&held)).await;
    assert!(
        matches!(renewed[..], [Ok(Renewal::Renewed { .. })]),
        "{renewed:?}"
    );
    assert!(a.release(&held).await.unwrap());
    let second = waiting
        .await
        .expect("the waiting acquire panicked")
        .unwrap()
        .expect("the waiter did not get the lock");
    assert!(b.release(&second).await.unwrap());

    let permit_request = |token: &str| PermitRequest {
        name: "forever-permits".into(),
        permits: 1,
        count: 1,
        token: token.into(),
        ttl: Duration::MAX,
    };
    let permit = a
        .permits()
        .expect("etcd has semaphores")
        .try_acquire_permit(&permit_request("first"))
        .await
        .unwrap()
        .unwrap();
    let waiting = {
        let (b, request) = (b.clone(), permit_request("second"));
        tokio::spawn(async move {
            b.permits()
                .expect("etcd has semaphores")
                .acquire_permit(&request, wait())
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let renewed = a
        .permits()
        .expect("etcd has semaphores")
        .renew_permits(std::slice::from_ref(&permit))
        .await;
    assert!(
        matches!(renewed[..], [Ok(Renewal::Renewed { .. })]),
        "{renewed:?}"
    );
    assert!(a
        .permits()
        .expect("etcd has semaphores")
        .release_permit(&permit)
        .await
        .unwrap());
    let second = waiting
        .await
        .expect("the waiting permit acquire panicked")
        .unwrap()
        .expect("the waiter did not get the permit");
    assert!(b
        .permits()
        .expect("etcd has semaphores")
        .release_permit(&second)
        .await
        .unwrap());
}

/// How many leases the server has (`LeaseLeases`).
async fn leases_on(raw: &mut etcd_client::Client) -> usize {
    tokio::time::timeout(Duration::from_secs(5), raw.leases())
        .await
        .expect("LeaseLeases within 5 s")
        .expect("LeaseLeases")
        .leases()
        .len()
}

/// Polls (bounded by `limit`) until the server has at most `most` leases;
/// returns the last count.
async fn leases_fall_to(raw: &mut etcd_client::Client, most: usize, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        let n = leases_on(raw).await;
        if n <= most || Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One lease per distinct ttl is kept only while it is used: after 100
/// acquire/release cycles with ttls 3600…3699 s the server holds ~100
/// leases, and once they have been idle for `SESSION_IDLE` it holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_leases_are_revoked() {
    const TTLS: u64 = 100;
    let fixture = EtcdFixture::single();
    let mut raw = raw_client(&fixture).await;
    let backend = connect(fixture.url()).await;
    for i in 0..TTLS {
        let guard = lock(&backend, &format!("ttl-{i}"))
            .ttl(Duration::from_secs(3600 + i))
            .acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    let used = leases_on(&mut raw).await;
    println!("leases after {TTLS} distinct ttls: {used}");
    assert!(used as u64 <= TTLS, "{used} leases for {TTLS} ttls");
    let limit = dlock::backends::etcd::SESSION_IDLE + Duration::from_secs(3);
    let left = leases_fall_to(&mut raw, 0, limit).await;
    println!("leases {limit:?} later: {left}");
    assert_eq!(
        left, 0,
        "idle session leases were not revoked within {limit:?}"
    );
    // The backend still works: a fresh session.
    let guard = lock(&backend, "after").acquire().await.unwrap();
    assert_eq!(leases_on(&mut raw).await, 1);
    guard.release().await.unwrap();
}

/// A backend dropped where no runtime runs (its runtime shut down first, in
/// a plain thread) revokes its session leases before the drop returns: the
/// process may end right after it. Dropped inside a runtime, it revokes them
/// in the background at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_dropped_outside_any_runtime_leaves_no_lease() {
    let fixture = EtcdFixture::single();
    let mut raw = raw_client(&fixture).await;
    let url = fixture.url().to_owned();
    // A plain thread: a blocking-pool thread of tokio's would be inside the
    // test's runtime.
    let dropped = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let backend = runtime.block_on(async {
            let backend = connect(&url).await;
            for ttl in [3600, 3601, 3602] {
                let guard = lock(&backend, "shutdown")
                    .ttl(Duration::from_secs(ttl))
                    .acquire()
                    .await
                    .unwrap();
                guard.release().await.unwrap();
            }
            backend
        });
        drop(runtime);
        let started = Instant::now();
        drop(backend);
        started.elapsed()
    });
    let took = blocking(|| dropped.join().unwrap());
    assert!(took < Duration::from_secs(3), "the drop took {took:?}");
    let left = leases_on(&mut raw).await;
    assert_eq!(left, 0, "{left} leases left after the drop returned");

    // Inside a runtime the drop does not block: the revokes follow at once.
    let backend = connect(fixture.url()).await;
    acquire_and_release(&lock(&backend, "inside")).await;
    assert_eq!(leases_on(&mut raw).await, 1);
    drop(backend);
    let left = leases_fall_to(&mut raw, 0, Duration::from_secs(2)).await;
    assert_eq!(
        left, 0,
        "{left} leases left 2 s after a drop inside the runtime"
    );
}

/// The lease of the one key under `dir` (`dlock/<key>/`), read with a raw client.
async fn lease_under(raw: &mut etcd_client::Client, dir: &str) -> i64 {
    let got = raw
        .get(dir, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let kv = got
        .kvs()
        .first()
        .unwrap_or_else(|| panic!("no key under {dir}"));
    kv.lease()
}

/// Acquisitions that come just as their session is revoked for idleness
/// (each task its own ttl, so its own session; its second acquisition lands
/// at one of 24 moments 100 ms apart around `SESSION_IDLE` after the first
/// one's release, while the check runs every second) always get a live
/// lease: the key is on the server on a lease etcd still has, and the guard
/// stays held. Both sides of the race happen: some get the old session,
/// some a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_racing_an_idle_revoke_gets_a_live_lease() {
    const TASKS: u64 = 24;
    let fixture = EtcdFixture::single();
    let backend = connect(fixture.url()).await;
    let other = connect(fixture.url()).await;
    let idle = dlock::backends::etcd::SESSION_IDLE;
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let (backend, other) = (backend.clone(), other.clone());
        let mut raw = raw_client(&fixture).await;
        tasks.push(tokio::spawn(async move {
            let key = format!("race-{i}");
            // Longer than the idle time: the session is revoked, not expired.
            let ttl = Duration::from_secs(6 + i);
            let named = || lock(&backend, &key).ttl(ttl);
            let dir = format!("dlock/{key}/");
            let first = named().acquire().await.unwrap();
            let old = lease_under(&mut raw, &dir).await;
            first.release().await.unwrap();
            // 100 ms steps over [idle - 0.6 s, idle + 1.8 s): the check
            // runs every second, so the revoke comes between idle and
            // idle + 1 s.
            let offset = Duration::from_millis(100 * i);
            tokio::time::sleep(idle - Duration::from_millis(600) + offset).await;
            let guard = named().acquire().await.unwrap();
            let lease = lease_under(&mut raw, &dir).await;
            let alive = raw.lease_time_to_live(lease, None).await.unwrap();
            assert!(alive.ttl() > 0, "{key}: the key is on a dead lease");
            assert!(lock(&other, &key).try_acquire().await.unwrap().is_none());
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(guard.is_held(), "{key}: lost after the acquire");
            guard.release().await.unwrap();
            lease == old
        }));
    }
    let reused = tokio::time::timeout(Duration::from_secs(20), async {
        let mut reused = 0;
        for task in tasks {
            reused += usize::from(task.await.expect("a racing acquisition failed"));
        }
        reused
    })
    .await
    .expect("the racing acquisitions did not finish within 20 s");
    println!("{reused} of {TASKS} got their old session, the others a fresh one");
    assert!(
        reused > 0 && reused < TASKS as usize,
        "the acquisitions did not straddle the revokes: {reused} of {TASKS} reused"
    );
}
