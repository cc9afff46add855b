//! ZooKeeper-specific behaviour on a real server: queue fairness, interop with
//! Apache Curator's `InterProcessMutex`, session expiry (and the start-over
//! of an acquisition on a session expired unknown to the client, for locks
//! and read-write locks alike), a crashed holder process, a stopped server,
//! key escaping and the node layout. (Read-write locks otherwise:
//! `zookeeper_rw.rs`.)
//!
//! Every wait is bounded; servers run on free loopback ports in temp dirs and
//! stop when their fixture is dropped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{distributed_lock, Lock, LockBackend, LockError, LockGuard, RwLock, MAX_TTL};
use dlock_tests::acquisitions::acquire_and_release;
use dlock_tests::curator::Curator;
use dlock_tests::fixtures::zookeeper::{ZkFixture, ZkServers, SESSION_TIMEOUT};
use dlock_tests::holder::{Holder, HolderSpec};
use dlock_tests::poll::eventually;
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::zookeeper::{ZkServer, ZkTls};
use dlock_tests::tls::TestCerts;
use dlock_tests::urls::invalid_option;

async fn backend(fixture: &ZkFixture) -> Arc<ZooKeeperBackend> {
    Arc::new(
        ZooKeeperBackend::connect(fixture.url())
            .await
            .expect("connect to the fixture"),
    )
}

fn lock(backend: &Arc<ZooKeeperBackend>, key: &str) -> Lock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    Lock::new(key).with_backend(backend)
}

fn rw_lock(backend: &Arc<ZooKeeperBackend>, key: &str) -> RwLock {
    let backend: Arc<dyn LockBackend> = backend.clone();
    RwLock::new(key).with_backend(backend)
}

/// What a test takes: a plain lock, or a side of the key's read-write
/// lock; all go through one acquire loop.
#[derive(Debug, Clone, Copy)]
enum Take {
    Lock,
    Read,
    Write,
    /// One permit of a semaphore of 2, named by the key.
    Permit,
}

/// What a [`Take`] holds.
enum Held {
    Guard(LockGuard),
    Permit(dlock::Permit),
}

impl Held {
    fn fencing_token(&self) -> Option<u64> {
        match self {
            Held::Guard(guard) => guard.fencing_token(),
            Held::Permit(_) => None,
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Held::Guard(guard) => guard.release().await,
            Held::Permit(permit) => permit.release().await,
        }
    }
}

impl Take {
    async fn acquire(
        self,
        b: &Arc<ZooKeeperBackend>,
        key: &str,
        wait: Duration,
    ) -> Result<Held, LockError> {
        match self {
            Take::Lock => lock(b, key).wait(wait).acquire().await.map(Held::Guard),
            Take::Read => rw_lock(b, key).wait(wait).read().await.map(Held::Guard),
            Take::Write => rw_lock(b, key).wait(wait).write().await.map(Held::Guard),
            Take::Permit => dlock::Semaphore::new(key, 2)
                .with_backend(b.clone())
                .wait(wait)
                .acquire()
                .await
                .map(Held::Permit),
        }
    }

    /// The nodes queued for what `self` takes of `key`.
    async fn nodes(self, fixture: &ZkFixture, key: &str) -> Vec<String> {
        match self {
            Take::Lock => fixture.contenders(key).await,
            Take::Read | Take::Write => fixture.rw_contenders(key).await,
            Take::Permit => fixture.permit_contenders(key).await,
        }
    }
}

/// Ten waiters, each on its own session, queue behind a holder one after
/// another and get the lock in exactly that order: each watches only its
/// predecessor, and the smallest sequence goes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_waiters_acquire_in_queue_order() {
    const WAITERS: usize = 10;
    let fixture = ZkFixture::start().await;
    let key = "fairness";
    let holder = backend(&fixture).await;
    let held = lock(&holder, key).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let b = backend(&fixture).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock(&b, key)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("waiter {i}: {e}"));
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        // Waiter i has queued when its node is there: holder + i + 1 nodes.
        eventually("waiter queued", Duration::from_secs(10), || async {
            fixture.contenders(key).await.len() == i + 2
        })
        .await;
    }
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        for t in tasks {
            t.await.expect("a waiter panicked");
        }
    })
    .await
    .expect("the waiters did not all finish within 60 s");
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
    assert!(
        fixture.contenders(key).await.is_empty(),
        "nodes left behind"
    );
}

/// Nodes have Curator's protected layout, the key is escaped into one node
/// name, and the fencing token is the node's czxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_use_the_curator_layout_and_escaped_keys() {
    let fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    let key = "tenant/7:order%42";
    assert_eq!(b.lock_path(key).unwrap(), "/dlock/tenant%2F7:order%2542");
    let guard = lock(&b, key).acquire().await.unwrap();
    let children = fixture.contenders(key).await;
    assert_eq!(children.len(), 1, "{children:?}");
    let name = &children[0];
    // _c_<36-char uuid>-lock-<10 digits>
    assert!(name.starts_with("_c_"), "{name}");
    let (uuid, seq) = name[3..].split_once("-lock-").expect("Curator's lock name");
    assert_eq!(uuid.len(), 36, "{name}");
    assert_eq!(seq.len(), 10, "{name}");
    let (_, stat) = fixture
        .admin()
        .get_data(&format!("{}/{name}", fixture.lock_path(key)))
        .await
        .unwrap();
    assert_eq!(guard.fencing_token(), Some(stat.czxid as u64));
    assert!(stat.ephemeral_owner != 0, "the lock node must be ephemeral");
    // try_acquire goes the same way and leaves nothing when it loses.
    let other = backend(&fixture).await;
    assert!(lock(&other, key).try_acquire().await.unwrap().is_none());
    assert_eq!(fixture.contenders(key).await.len(), 1);
    guard.release().await.unwrap();
    assert!(fixture.contenders(key).await.is_empty());
}

/// The last request id (`lcxid`) the server processed for `session`, from
/// its `cons` four-letter command: the client numbers each request it sends
/// (heartbeats aside), so the difference between two readings counts the
/// requests sent in between.
fn requests_seen(fixture: &ZkFixture, session: zookeeper_client::SessionId) -> i64 {
    let ZkServers::Single(server) = &fixture.servers else {
        unreachable!("a standalone fixture")
    };
    let cons = tokio::task::block_in_place(|| server.four_letter("cons"))
        .unwrap_or_else(|e| panic!("cons: {e}"));
    let sid = format!("sid=0x{:x},", session.0);
    let line = cons
        .lines()
        .find(|l| l.contains(&sid))
        .unwrap_or_else(|| panic!("no connection of session {sid} in:\n{cons}"));
    let lcxid = line
        .split([',', '(', ')'])
        .find_map(|f| f.strip_prefix("lcxid=0x"))
        .unwrap_or_else(|| panic!("no lcxid in {line}"));
    i64::from_str_radix(lcxid, 16).unwrap_or_else(|e| panic!("lcxid {lcxid} in {line}: {e}"))
}

/// An uncontended `acquire` + `release` sends three requests: the create,
/// one listing of the queue (the fencing token comes from the create's own
/// stat, so no read of the node follows), and the release's delete, with
/// nothing left to delete in the background. The same for the read and the
/// write side of a read-write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_a_create_a_listing_and_a_delete() {
    const CYCLES: i64 = 10;
    let fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    let key = "fast-path";
    let wait = Duration::from_secs(10);
    for take in [Take::Lock, Take::Read, Take::Write] {
        // The first cycle also creates the key's directory.
        let first = take.acquire(&b, key, wait).await.unwrap();
        first.release().await.unwrap();
        let session = b.client().expect("a live session").session_id();
        // Background work of a cycle lands within moments; wait for it
        // before each reading, so it is counted in the cycle that caused it.
        let settle = Duration::from_millis(300);
        tokio::time::sleep(settle).await;
        let before = requests_seen(&fixture, session);
        for _ in 0..CYCLES {
            let guard = take.acquire(&b, key, wait).await.unwrap();
            assert!(guard.fencing_token().is_some());
            guard.release().await.unwrap();
        }
        tokio::time::sleep(settle).await;
        let sent = requests_seen(&fixture, session) - before;
        // Slack of one renewal (a sync and a read), should the watchdog run.
        assert!(
            sent <= 3 * CYCLES + 2,
            "{CYCLES} uncontended {take:?} cycles sent {sent} requests, {:.1} a cycle: more \
             than create, list and delete",
            sent as f64 / CYCLES as f64
        );
        assert!(
            take.nodes(&fixture, key).await.is_empty(),
            "{take:?}: nodes left behind"
        );
    }
}

/// A waiter whose wait runs out has deleted its node by the time `acquire`
/// returns, so it never stands between the holder and the next contender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_leaves_no_node() {
    let fixture = ZkFixture::start().await;
    let key = "timeout-cleanup";
    let (a, b) = (backend(&fixture).await, backend(&fixture).await);
    let held = lock(&a, key).acquire().await.unwrap();
    let err = lock(&b, key)
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert_eq!(
        fixture.contenders(key).await.len(),
        1,
        "the waiter's node is still queued"
    );
    held.release().await.unwrap();
}

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

/// Curator's `InterProcessMutex` and dlock exclude each other on the same
/// path, both ways, because both queue `_c_<uuid>-lock-<seq>` children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_interprocess_mutex_and_dlock_exclude_each_other() {
    let fixture = ZkFixture::start().await;
    let key = "interop";
    let path = fixture.lock_path(key);
    let connect = fixture.connect_string();
    let b = backend(&fixture).await;
    let startup = Duration::from_secs(30);

    // Curator holds; dlock waits until Curator releases.
    let mut curator = Curator::mutex(&connect, &path, "hold", 1500);
    assert_eq!(curator.line(startup).await, "ACQUIRED");
    let curator_got_it = Instant::now();
    assert!(
        lock(&b, key).try_acquire().await.unwrap().is_none(),
        "dlock took a lock Curator holds"
    );
    let guard = lock(&b, key)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("dlock never got the lock after Curator released it");
    assert!(
        curator_got_it.elapsed() >= Duration::from_millis(1200),
        "dlock got the lock {:?} after Curator took it for 1.5 s",
        curator_got_it.elapsed()
    );
    assert_eq!(curator.line(Duration::from_secs(5)).await, "RELEASED");
    curator.exits_cleanly().await;

    // dlock holds; Curator cannot get it, then waits and gets it on release.
    let mut short = Curator::mutex(&connect, &path, "try", 1000);
    assert_eq!(
        short.line(startup).await,
        "TIMEOUT",
        "Curator took a lock dlock holds"
    );
    short.exits_cleanly().await;
    let mut waiting = Curator::mutex(&connect, &path, "try", 20_000);
    eventually("Curator queued", startup, || async {
        fixture.contenders(key).await.len() == 2
    })
    .await;
    guard.release().await.unwrap();
    assert_eq!(waiting.line(Duration::from_secs(10)).await, "ACQUIRED");
    assert_eq!(waiting.line(Duration::from_secs(10)).await, "RELEASED");
    waiting.exits_cleanly().await;
}

// ------------------------------------------------------- sessions and faults

/// Closing the backend's session from a second client with the same session
/// id and password (as Curator's `KillSession` does) expires it: the guard's
/// `lost()` fires, its release says `NotHeld`, and the backend opens a new
/// session for the next acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_loses_every_guard_of_the_session() {
    let fixture = ZkFixture::start().await;
    let (proxy, b) = proxied(&fixture).await;
    let one = lock(&b, "expiry-1")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let two = lock(&b, "expiry-2")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let (lost_one, lost_two) = (one.lost(), two.lost());

    let old_id = b.client().expect("a live session").session_id();
    expire_session(&fixture, &proxy, &b, "expiry-1").await;

    let limit = SESSION_TIMEOUT + Duration::from_secs(3);
    let start = Instant::now();
    tokio::time::timeout(limit, async {
        lost_one.await;
        lost_two.await;
    })
    .await
    .unwrap_or_else(|_| panic!("lost() did not fire within {limit:?} of the session's close"));
    assert!(start.elapsed() < limit);
    assert!(!one.is_held() && !two.is_held());
    assert!(matches!(
        one.release().await,
        Err(LockError::NotHeld { .. })
    ));
    assert!(matches!(
        two.release().await,
        Err(LockError::NotHeld { .. })
    ));
    assert!(
        fixture.contenders("expiry-1").await.is_empty(),
        "the expired session's node survived"
    );

    // A new session serves the next acquisition.
    acquire_on_a_new_session(&b, "expiry-1", old_id, "acquire after the session expired").await;
}

/// Runs `work` in a thread of its own, on a current-thread runtime it is
/// given to end (as a `#[tokio::test]` helper or a `block_on` in a thread
/// makes one), and answers what `work` answers (bounded: 30 s).
async fn on_a_helper_runtime<T: Send + 'static>(
    work: impl FnOnce(tokio::runtime::Runtime) -> T + Send + 'static,
) -> T {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a helper runtime");
        let _ = done_tx.send(work(rt));
    });
    tokio::time::timeout(Duration::from_secs(30), done_rx)
        .await
        .expect("the helper runtime did not finish within 30 s")
        .expect("the helper thread panicked")
}

/// A guard taken on a short-lived current-thread runtime (as a
/// `#[tokio::test]` helper or a `block_on` in a thread makes one) and dropped
/// as that runtime ends frees its key within the ttl, though the backend and
/// its session live on (on dlock's runtime): one guard dies with a task of
/// that runtime at its shutdown, the other is dropped after the runtime is
/// gone. Neither can run its release on that runtime; the node must still go
/// when the lease runs out, as dlock::guide::guarantees promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_dropped_with_their_runtime_free_the_key_within_the_ttl() {
    let fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    let other = backend(&fixture).await;
    let ttl = Duration::from_secs(3);
    let (in_task, after) = ("dead-runtime:task", "dead-runtime:after");
    let (lock_in_task, lock_after) = (lock(&b, in_task).ttl(ttl), lock(&b, after).ttl(ttl));
    let dropped_at = on_a_helper_runtime(move |rt| {
        let (one, two) = rt.block_on(async {
            let one = lock_in_task
                .acquire()
                .await
                .expect("acquire on the helper runtime");
            let two = lock_after
                .acquire()
                .await
                .expect("acquire on the helper runtime");
            (one, two)
        });
        // Dropped by the runtime's shutdown, with the task that holds it.
        rt.spawn(async move {
            let _held = one;
            std::future::pending::<()>().await
        });
        drop(rt);
        // Dropped with no runtime left at all.
        drop(two);
        Instant::now()
    })
    .await;

    let limit = Duration::from_secs(6);
    for key in [in_task, after] {
        let got = lock(&other, key)
            .wait(limit.saturating_sub(dropped_at.elapsed()))
            .acquire()
            .await;
        let took = dropped_at.elapsed();
        let guard = match got {
            Ok(g) => g,
            Err(e) => {
                let queue = fixture.contenders(key).await;
                panic!("{key}: another client could not get the key {took:?} after its guard was dropped with its runtime (ttl {ttl:?}): {e}; queue {queue:?}; holder backend {b:?}")
            }
        };
        guard.release().await.unwrap();
    }
}

/// A backend connected on a runtime that then ends (a backend made in one
/// `#[tokio::test]` and kept in a static for the next) keeps its session,
/// which runs on dlock's own runtime: a lease taken on the ended runtime is
/// still renewed past the session timeout, and the next acquisition, on
/// another runtime, uses the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_whose_runtime_ended_keeps_its_session() {
    let fixture = ZkFixture::start().await;
    let url = fixture.url().to_owned();
    let key = "orphaned-session";
    let (orphaned, guard) = on_a_helper_runtime(move |rt| {
        let (backend, guard) = rt.block_on(async {
            let backend = Arc::new(ZooKeeperBackend::connect(&url).await.expect("connect"));
            let guard = lock(&backend, key).acquire().await.expect("acquire");
            (backend, guard)
        });
        drop(rt);
        (backend, guard)
    })
    .await;
    let session = orphaned.client().expect("a live session").session_id();

    // Long enough for the server to expire a session nobody kept alive.
    tokio::time::sleep(SESSION_TIMEOUT + Duration::from_secs(1)).await;
    assert!(
        guard.is_held(),
        "the lease of the ended runtime lapsed: its session died with that runtime"
    );
    let other = backend(&fixture).await;
    assert!(
        lock(&other, key).try_acquire().await.unwrap().is_none(),
        "another client took a key whose holder still believes it holds it"
    );
    let fresh = lock(&orphaned, "fresh")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire on the backend of the ended runtime");
    assert_eq!(
        orphaned.client().expect("a live session").session_id(),
        session,
        "the backend opened a new session"
    );
    fresh.release().await.unwrap();
    guard.release().await.unwrap();
    let freed = lock(&other, key)
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the release");
    freed.release().await.unwrap();
}

/// A backend that reaches the fixture's standalone server through a fault
/// proxy, so a test can cut it off.
async fn proxied(fixture: &ZkFixture) -> (FaultProxy, Arc<ZooKeeperBackend>) {
    let ZkServers::Single(server) = &fixture.servers else {
        unreachable!("a standalone fixture")
    };
    let proxy = FaultProxy::start(server.addr()).await;
    let url = format!(
        "zk://{}?session_timeout={}ms",
        proxy.addr(),
        SESSION_TIMEOUT.as_millis()
    );
    let backend = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    (proxy, backend)
}

/// Expires `backend`'s session the way Curator's `KillSession` does: a second
/// client re-establishes it with the same id and password and closes it. The
/// backend is cut off by its proxy meanwhile (else its reconnects would keep
/// taking the session back), and reconnects after the close, to hear that the
/// session expired. Returns once the server dropped the session's `key` node.
async fn expire_session(
    fixture: &ZkFixture,
    proxy: &FaultProxy,
    backend: &ZooKeeperBackend,
    key: &str,
) {
    expire_session_leaving(fixture, proxy, backend, key, 0).await;
}

/// [`expire_session`], returning once `key` has `left` nodes of other
/// sessions.
async fn expire_session_leaving(
    fixture: &ZkFixture,
    proxy: &FaultProxy,
    backend: &ZooKeeperBackend,
    key: &str,
    left: usize,
) {
    let session = backend.client().expect("a live session").session().clone();
    proxy.reset();
    kill_session(fixture, session).await;
    eventually(
        "the closed session's node is deleted",
        Duration::from_secs(5),
        || async { fixture.contenders(key).await.len() == left },
    )
    .await;
    proxy.pass();
}

/// The next acquisition of `key` on `b`, after its session `old_id` expired:
/// it must succeed (`what` names it in the failure) on a new session.
async fn acquire_on_a_new_session(
    b: &Arc<ZooKeeperBackend>,
    key: &str,
    old_id: zookeeper_client::SessionId,
    what: &str,
) {
    let again = lock(b, key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_ne!(
        b.client().expect("a live session").session_id(),
        old_id,
        "the expired session was reused"
    );
    again.release().await.unwrap();
}

/// Ends `session` on the server the way Curator's `KillSession` does: a
/// second client re-establishes it with the same id and password, and
/// dropping that client's last handle closes it.
async fn kill_session(fixture: &ZkFixture, session: zookeeper_client::SessionInfo) {
    let intruder = zookeeper_client::Client::connector()
        .with_session(session)
        .connect(&fixture.connect_string())
        .await
        .expect("re-establish the session from a second client");
    intruder
        .check_stat("/")
        .await
        .expect("the intruder owns the session");
    drop(intruder);
}

/// A waiter whose session expires while it waits fails with a backend error
/// as soon as it hears of the expiry, instead of waiting out its deadline;
/// its node went with the session, the holder keeps the lock, and the
/// backend's next acquisition runs on a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_session_expires_fails_without_waiting_out_its_deadline() {
    let fixture = ZkFixture::start().await;
    let key = "expiry-waiting";
    let holder = backend(&fixture).await;
    let held = lock(&holder, key).acquire().await.unwrap();
    let (proxy, b) = proxied(&fixture).await;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { lock(&b, key).wait(Duration::from_secs(60)).acquire().await }
    });
    eventually("the waiter queued", Duration::from_secs(10), || async {
        fixture.contenders(key).await.len() == 2
    })
    .await;
    let old_id = b.client().expect("a live session").session_id();
    expire_session_leaving(&fixture, &proxy, &b, key, 1).await;

    let limit = SESSION_TIMEOUT + Duration::from_secs(5);
    let got = tokio::time::timeout(limit, waiting)
        .await
        .unwrap_or_else(|_| panic!("the waiter still waited {limit:?} after its session expired"))
        .expect("the waiter panicked");
    match got {
        Err(LockError::Backend { .. }) => {}
        other => panic!("expected a backend error from the expired session, got {other:?}"),
    }
    assert!(held.is_held(), "the holder lost the lock");
    assert_eq!(
        fixture.contenders(key).await.len(),
        1,
        "the expired waiter's node survived"
    );
    held.release().await.unwrap();
    acquire_on_a_new_session(
        &b,
        key,
        old_id,
        "acquire after the waiter's session expired",
    )
    .await;
}

/// An acquisition started while the backend is cut off, on a session the
/// server expires meanwhile: the client learns of the expiry only when it
/// reconnects, as the acquisition's first request fails with "session
/// expired". Nothing was queued, so the acquisition starts over on a new
/// session and takes the free key, instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_sent_on_a_session_expired_unknown_to_the_client_starts_over() {
    starts_over_on_a_new_session(Take::Lock).await;
}

/// The same for the write side of a read-write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_on_a_session_expired_unknown_to_the_client_starts_over() {
    starts_over_on_a_new_session(Take::Write).await;
}

/// The same for a semaphore's permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_asked_on_a_session_expired_unknown_to_the_client_starts_over() {
    starts_over_on_a_new_session(Take::Permit).await;
}

async fn starts_over_on_a_new_session(take: Take) {
    let fixture = ZkFixture::start().await;
    let key = "expired-unknowingly";
    let (proxy, b) = proxied(&fixture).await;
    let old_session = b.client().expect("a live session").session().clone();
    let old_id = old_session.id();
    // Cut off: the client reconnects in a loop, its requests wait. The
    // acquisition starts only once the client has noticed, so that none of
    // its requests reaches the server before the session is gone.
    let client = b.client().expect("a live session");
    proxy.reset();
    eventually(
        "the client noticed it is cut off",
        Duration::from_secs(10),
        || {
            let state = client.state();
            async move { state != zookeeper_client::SessionState::SyncConnected }
        },
    )
    .await;
    let acquiring = tokio::spawn({
        let b = b.clone();
        async move { take.acquire(&b, key, Duration::from_secs(20)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The server expires the session meanwhile.
    kill_session(&fixture, old_session).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.pass();
    let guard = tokio::time::timeout(Duration::from_secs(25), acquiring)
        .await
        .expect("the acquisition did not finish")
        .expect("the acquisition panicked")
        .expect("an acquisition that never got a place failed with the expired session");
    assert_ne!(
        b.client().expect("a live session").session_id(),
        old_id,
        "the expired session was used"
    );
    assert_eq!(take.nodes(&fixture, key).await.len(), 1);
    guard.release().await.unwrap();
}

/// A critical section far longer than the test; the session under it expires.
#[distributed_lock(key = "expiring:{id}", ttl = "30s", backend = "zk-session-expiry")]
async fn long_critical_section(
    id: u64,
    started: tokio::sync::oneshot::Sender<()>,
) -> Result<&'static str, LockError> {
    let _ = started.send(());
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok("finished")
}

/// An annotated fn with the default `on_lost = "cancel"` whose session
/// expires mid-body returns `Err(Lost)` at once instead of running on
/// unprotected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_cancels_an_annotated_fn() {
    let fixture = ZkFixture::start().await;
    let (proxy, b) = proxied(&fixture).await;
    dlock::registry().register("zk-session-expiry", b.clone());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let job = tokio::spawn(long_critical_section(1, started_tx));
    tokio::time::timeout(Duration::from_secs(10), started_rx)
        .await
        .expect("the body did not start within 10 s")
        .expect("the body dropped its start signal");
    expire_session(&fixture, &proxy, &b, "expiring:1").await;
    let limit = SESSION_TIMEOUT + Duration::from_secs(3);
    let result = tokio::time::timeout(limit, job)
        .await
        .unwrap_or_else(|_| {
            panic!("the annotated fn ran on for {limit:?} after its session closed")
        })
        .unwrap();
    assert!(
        matches!(result, Err(LockError::Lost { ref key }) if key == "expiring:1"),
        "{result:?}"
    );
}

/// A holder process killed with SIGKILL leaves its session to expire on the
/// server: the next waiter gets the lock after about the session timeout, not
/// before and not much later, with a larger fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_the_lock_after_the_session_timeout() {
    let fixture = ZkFixture::start().await;
    let key = "crash";
    let mut holder = Holder::spawn(
        env!("CARGO_BIN_EXE_lock-holder"),
        &HolderSpec::once(
            fixture.url(),
            key,
            Duration::from_secs(30),
            Duration::from_secs(120),
        ),
    );
    let token = holder.acquired(Duration::from_secs(30)).await;
    let fence: u64 = token
        .parse()
        .unwrap_or_else(|_| panic!("unexpected lock-holder token {token:?}"));

    holder.kill9().await;
    let killed_at = Instant::now();
    let b = backend(&fixture).await;
    let guard = lock(&b, key)
        .wait(SESSION_TIMEOUT * 3)
        .acquire()
        .await
        .expect("the crashed holder's lock was never freed");
    let took = killed_at.elapsed();
    assert!(
        took >= SESSION_TIMEOUT / 2,
        "got the lock {took:?} after the kill: the dead holder's session cannot have expired yet"
    );
    assert!(
        took <= SESSION_TIMEOUT + Duration::from_secs(3),
        "got the lock only {took:?} after the kill (session timeout {SESSION_TIMEOUT:?})"
    );
    assert!(guard.fencing_token().unwrap() > fence);
    guard.release().await.unwrap();
}

/// With the server stopped, `acquire` fails with `Backend` within its wait
/// (not `Timeout`: the service did not answer), and so does `try_acquire`;
/// a held guard is lost within its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_a_backend_error_within_the_wait() {
    let mut fixture = ZkFixture::start().await;
    let b = backend(&fixture).await;
    let ttl = Duration::from_secs(2);
    let held = lock(&b, "held").ttl(ttl).acquire().await.unwrap();
    let lost = held.lost();
    let ZkServers::Single(server) = &mut fixture.servers else {
        unreachable!("a standalone fixture")
    };
    tokio::task::block_in_place(|| server.stop());
    let stopped_at = Instant::now();

    let wait = Duration::from_secs(2);
    let start = Instant::now();
    let err = lock(&b, "other").wait(wait).acquire().await.unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(
        took <= wait + Duration::from_millis(500),
        "returned after {took:?}"
    );
    assert!(err.to_string().contains("unreachable"), "{err}");

    let err = lock(&b, "other").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");

    tokio::time::timeout(ttl + Duration::from_secs(1), lost)
        .await
        .expect("the guard was not lost within its ttl of the server stopping");
    assert!(stopped_at.elapsed() <= ttl + Duration::from_secs(1));
}

/// Bad URLs are `InvalidOption` errors that name the URL without its password.
#[tokio::test]
async fn bad_urls_are_rejected_without_showing_the_password() {
    for url in [
        "zk://",
        "zk://u:hunter2@h:notaport",
        "zk://h:1?session_timeout=soon",
        "zk://h:1?colour=red",
    ] {
        let err = invalid_option(url).await;
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
    // Nobody listens on port 1: a Backend error, quickly.
    let start = Instant::now();
    let err = dlock::connect("zk://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// On a three-node ensemble, a guard survives the crash of the leader: the
/// session moves to a surviving node within its timeout, renewals resume,
/// and the lock still excludes others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_survives_the_leader_crashing_in_an_ensemble() {
    let mut fixture = ZkFixture::ensemble().await;
    // A session (and so a lease, 11/20 of it) long enough that a slow
    // election on a busy 2-core machine is not mistaken for a loss.
    let session = Duration::from_secs(20);
    let lease = session / 20 * 11;
    let base = fixture.url().split('?').next().unwrap().to_owned();
    let url = format!("{base}?session_timeout={}ms", session.as_millis());
    let a = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    let b = backend(&fixture).await;
    assert_eq!(a.session_timeout(), session);
    let guard = lock(&a, "failover").acquire().await.unwrap();
    let lost = guard.lost();
    let ZkServers::Ensemble(ensemble) = &mut fixture.servers else {
        unreachable!("an ensemble fixture")
    };
    tokio::task::block_in_place(|| {
        let leader = ensemble
            .wait_for_leader(Duration::from_secs(10))
            .expect("a leader");
        ensemble.node_mut(leader).kill9();
        ensemble
            .wait_for_leader(Duration::from_secs(20))
            .expect("a new leader among the survivors");
    });
    // Past the local deadline of every renewal sent before the crash: any
    // renewal that failed for good would have been declared lost by now.
    let survived = tokio::time::timeout(lease + Duration::from_secs(1), lost)
        .await
        .is_err();
    assert!(
        survived,
        "the guard was lost although the ensemble kept a quorum"
    );
    assert!(guard.is_held());
    assert!(lock(&b, "failover").try_acquire().await.unwrap().is_none());
    guard.release().await.expect("release after the fail-over");
    let next = lock(&b, "failover")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    next.release().await.unwrap();
}

/// A chroot in the URL roots every lock node under it; a chroot that does not
/// exist is a `Backend` error that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chroot_roots_the_lock_nodes_and_must_exist() {
    let fixture = ZkFixture::start().await;
    let base = fixture.url().split('?').next().unwrap().to_owned();
    let admin = fixture.admin();
    admin
        .create(
            "/app",
            b"",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let rooted = Arc::new(
        ZooKeeperBackend::connect(&format!("{base}/app"))
            .await
            .unwrap(),
    );
    let guard = lock(&rooted, "job").acquire().await.unwrap();
    let children = admin.list_children("/app/dlock/job").await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    guard.release().await.unwrap();

    let missing = Arc::new(
        ZooKeeperBackend::connect(&format!("{base}/nowhere"))
            .await
            .unwrap(),
    );
    for err in [
        lock(&missing, "job")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap_err(),
        lock(&missing, "job").try_acquire().await.unwrap_err(),
    ] {
        assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
        assert!(err.to_string().contains("chroot does not exist"), "{err}");
    }
}

/// With digest credentials in the URL, the directories and nodes dlock
/// creates are writable only by that identity and readable by anyone: a
/// client without the credentials can list the queue and read the holder's
/// node, but cannot queue, delete or change it; a client with the same
/// credentials contends normally. The password never shows in `describe()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_protects_the_lock_namespace() {
    let fixture = ZkFixture::start().await;
    let url = fixture.url().replacen("zk://", "zk://locker:s3cret@", 1);
    let authed = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    assert!(
        !authed.describe().contains("s3cret"),
        "{}",
        authed.describe()
    );
    let guard = lock(&authed, "guarded").acquire().await.unwrap();
    let children = fixture.contenders("guarded").await;
    assert_eq!(children.len(), 1);
    let node = format!("{}/{}", fixture.lock_path("guarded"), children[0]);

    let admin = fixture.admin();
    admin
        .get_data(&node)
        .await
        .expect("anyone may read a lock node");
    assert_eq!(
        admin.delete(&node, None).await,
        Err(zookeeper_client::Error::NoAuth)
    );
    assert_eq!(
        admin.set_data(&node, b"mine now", None).await.unwrap_err(),
        zookeeper_client::Error::NoAuth
    );
    let stranger = backend(&fixture).await;
    let err = lock(&stranger, "guarded").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");

    let colleague = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    assert!(lock(&colleague, "guarded")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let next = lock(&colleague, "guarded")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    next.release().await.unwrap();
}

/// A raw session without credentials: the anonymous client of the ACL tests.
async fn anonymous(fixture: &ZkFixture) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(&fixture.connect_string())
        .await
        .expect("an anonymous session")
}

/// A dlock backend on the fixture's server with `prefix` and, if given,
/// credentials and options.
async fn backend_with(
    fixture: &ZkFixture,
    credentials: Option<&str>,
    query: &str,
) -> Arc<ZooKeeperBackend> {
    let userinfo = credentials.map_or(String::new(), |c| format!("{c}@"));
    let url = format!(
        "zk://{userinfo}{}?session_timeout={}ms&{query}",
        fixture.connect_string(),
        SESSION_TIMEOUT.as_millis()
    );
    Arc::new(ZooKeeperBackend::connect(&url).await.unwrap())
}

/// Whether an anonymous dlock client fails to take `key` under `prefix`
/// (busy, or refused by the server): it must never get it.
async fn anonymous_cannot_take(fixture: &ZkFixture, prefix: &str, key: &str) {
    let stranger = backend_with(fixture, None, &format!("prefix={prefix}")).await;
    match lock(&stranger, key).try_acquire().await {
        Ok(None) | Err(LockError::Backend { .. }) => {}
        other => panic!("an anonymous client took {key}: {other:?}"),
    }
}

fn open_acl() -> zookeeper_client::CreateOptions<'static> {
    zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all())
}

/// Whether `acl` lets anyone (`world:anyone`) do more than read.
fn open_to_anyone(acl: &[zookeeper_client::Acl]) -> bool {
    acl.iter().any(|a| {
        a.scheme() == "world"
            && a.id() == "anyone"
            && a.permission() != zookeeper_client::Permission::READ
    })
}

/// `authed` takes the lock `victim` under `prefix`, whose directory an
/// anonymous client made open: while it holds it, the directory is no
/// longer open, its one node cannot be deleted by `anon`, and an anonymous
/// dlock client cannot take the lock. Then it lets go.
async fn victim_is_tightened_while_held(
    fixture: &ZkFixture,
    authed: &Arc<ZooKeeperBackend>,
    anon: &zookeeper_client::Client,
    prefix: &str,
) {
    let dir = format!("/{prefix}/victim");
    let guard = lock(authed, "victim").acquire().await.unwrap();
    let (acl, _) = anon.get_acl(&dir).await.unwrap();
    assert!(!open_to_anyone(&acl), "still open: {acl:?}");
    let children = anon.list_children(&dir).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let node = format!("{dir}/{}", children[0]);
    assert_eq!(
        anon.delete(&node, None).await,
        Err(zookeeper_client::Error::NoAuth)
    );
    anonymous_cannot_take(fixture, prefix, "victim").await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// Issue 31, case 3: an anonymous client pre-creates the prefix and the key
/// directory open to anyone. dlock with credentials tightens the directory
/// before it hands out the lock, so the anonymous client can neither delete
/// the holder's node nor take the lock; a directory dlock's identity may
/// not change is refused with an error naming the node and its ACL (and no
/// password). The read-write lock's and the semaphore's directories alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_directory_made_by_anyone_is_tightened_or_refused() {
    let fixture = ZkFixture::start().await;
    let anon = anonymous(&fixture).await;
    anon.create("/p5", b"", &open_acl()).await.unwrap();
    anon.create("/p5/victim", b"", &open_acl()).await.unwrap();
    let authed = backend_with(&fixture, Some("app:pw-Secret9"), "prefix=p5").await;
    victim_is_tightened_while_held(&fixture, &authed, &anon, "p5").await;

    // The read-write lock's and the semaphore's directories alike.
    for dir in [
        "/p5-rw",
        "/p5-rw/victim",
        "/p5-semaphores",
        "/p5-semaphores/victim",
    ] {
        anon.create(dir, b"", &open_acl()).await.unwrap();
    }
    let write = rw_lock(&authed, "victim").write().await.unwrap();
    let backend: Arc<dyn LockBackend> = authed.clone();
    let permit = dlock::Semaphore::new("victim", 2)
        .with_backend(backend)
        .acquire()
        .await
        .unwrap();
    for dir in ["/p5-rw/victim", "/p5-semaphores/victim"] {
        let (acl, _) = anon.get_acl(dir).await.unwrap();
        assert!(!open_to_anyone(&acl), "{dir} still open: {acl:?}");
        let node = anon.list_children(dir).await.unwrap().remove(0);
        assert_eq!(
            anon.delete(&format!("{dir}/{node}"), None).await,
            Err(zookeeper_client::Error::NoAuth),
            "{dir}"
        );
    }
    write.release().await.unwrap();
    permit.release().await.unwrap();

    // Open to anyone but for ADMIN: dlock may not tighten it, so it refuses.
    let no_admin = [zookeeper_client::Acl::new(
        zookeeper_client::Permission::CREATE
            | zookeeper_client::Permission::DELETE
            | zookeeper_client::Permission::READ
            | zookeeper_client::Permission::WRITE,
        zookeeper_client::AuthId::anyone(),
    )];
    anon.create(
        "/p5/stuck",
        b"",
        &zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::new(&no_admin)),
    )
    .await
    .unwrap();
    for err in [
        lock(&authed, "stuck").try_acquire().await.unwrap_err(),
        lock(&authed, "stuck")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap_err(),
    ] {
        let text = err.to_string();
        assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
        assert!(text.contains("/p5/stuck"), "{text}");
        assert!(text.contains("world:anyone:cdrw"), "{text}");
        assert!(!text.contains("Secret9"), "{text}");
    }
    // The refused acquisitions left no node behind.
    eventually(
        "the refused nodes are deleted",
        Duration::from_secs(5),
        || async { anon.list_children("/p5/stuck").await.unwrap().is_empty() },
    )
    .await;
}

/// Issue 31, case 3, the other way in: the key directory (a container)
/// vanishes between two acquisitions, as the server removes idle containers,
/// and an anonymous client creates it again open. The next acquisition
/// tightens it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_vanished_and_came_back_open_is_tightened_again() {
    let fixture = ZkFixture::start().await;
    let authed = backend_with(&fixture, Some("app:pw"), "prefix=p6").await;
    acquire_and_release(&lock(&authed, "victim")).await;
    // What the server's container reaper does to idle directories.
    let owner = zookeeper_client::Client::connector()
        .with_auth("digest", b"app:pw")
        .connect(&fixture.connect_string())
        .await
        .unwrap();
    owner.delete("/p6/victim", None).await.unwrap();
    owner.delete("/p6", None).await.unwrap();
    let anon = anonymous(&fixture).await;
    anon.create("/p6", b"", &open_acl()).await.unwrap();
    anon.create("/p6/victim", b"", &open_acl()).await.unwrap();

    victim_is_tightened_while_held(&fixture, &authed, &anon, "p6").await;
}

/// `?acl=creator`: nobody but the URL's identity may even read: an
/// anonymous client cannot list the queue (nor the prefix, which it had
/// made open itself: dlock tightened it) or read a holder's node, while a
/// colleague with the same credentials contends normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_creator_hides_the_queue_from_everyone_else() {
    let fixture = ZkFixture::start().await;
    // A prefix node someone made open is tightened when dlock creates a key
    // directory under it.
    let anon = anonymous(&fixture).await;
    anon.create("/hidden", b"", &open_acl()).await.unwrap();
    let authed = backend_with(&fixture, Some("app:pw"), "prefix=hidden&acl=creator").await;
    let guard = lock(&authed, "secret").acquire().await.unwrap();
    for dir in ["/hidden", "/hidden/secret"] {
        assert_eq!(
            anon.list_children(dir).await,
            Err(zookeeper_client::Error::NoAuth),
            "{dir}"
        );
    }
    let owner = authed.client().unwrap();
    let children = owner.list_children("/hidden/secret").await.unwrap();
    let node = format!("/hidden/secret/{}", children[0]);
    assert_eq!(
        anon.get_data(&node).await.unwrap_err(),
        zookeeper_client::Error::NoAuth
    );
    anonymous_cannot_take(&fixture, "hidden", "secret").await;
    let colleague = backend_with(&fixture, Some("app:pw"), "prefix=hidden&acl=creator").await;
    assert!(lock(&colleague, "secret")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
    let next = lock(&colleague, "secret").try_acquire().await.unwrap();
    assert!(next.is_some());
}

/// `?acl=open` gives open nodes, credentials or not (documented: anyone may
/// then delete a holder's node); `creator_read` and `creator` without
/// credentials are an `InvalidOption` that says credentials are needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_open_gives_open_nodes_and_the_others_need_credentials() {
    let fixture = ZkFixture::start().await;
    let authed = backend_with(&fixture, Some("app:pw"), "prefix=public&acl=open").await;
    let guard = lock(&authed, "shared").acquire().await.unwrap();
    let anon = anonymous(&fixture).await;
    let children = anon.list_children("/public/shared").await.unwrap();
    let node = format!("/public/shared/{}", children[0]);
    for path in ["/public", "/public/shared", node.as_str()] {
        let (acl, _) = anon.get_acl(path).await.unwrap();
        assert_eq!(acl, *zookeeper_client::Acls::anyone_all(), "{path}");
    }
    anon.delete(&node, None).await.unwrap();
    let lost = guard.lost();
    assert!(tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .is_ok());

    for acl in ["creator_read", "creator"] {
        let url = format!("{}&acl={acl}", fixture.url());
        let err = ZooKeeperBackend::connect(&url).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(err.to_string().contains("need credentials"), "{err}");
    }
}

/// Issue 31, case 6 (ZooKeeper): with `zk://h/app?prefix=x`, the key
/// directory of `Lock("lock-0")` is `/app/x/lock-0`, a child of the
/// directory where `zk://h?prefix=app` queues `Lock("x")`. It is no lock
/// node (not `_c_<uuid>-lock-<10 digits>`), so it must not block `x`; the
/// same for a read-write lock and a key directory named like a write node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_prefixs_key_directory_is_no_contender() {
    let fixture = ZkFixture::start().await;
    let admin = fixture.admin();
    for chroot in ["/app", "/app-rw"] {
        admin.create(chroot, b"", &open_acl()).await.unwrap();
    }
    let at = |chroot: &str, prefix: &str| {
        format!(
            "zk://{}{chroot}?prefix={prefix}&session_timeout={}ms",
            fixture.connect_string(),
            SESSION_TIMEOUT.as_millis()
        )
    };
    let nested = Arc::new(ZooKeeperBackend::connect(&at("/app", "x")).await.unwrap());
    let nested_rw = Arc::new(
        ZooKeeperBackend::connect(&at("/app-rw", "x"))
            .await
            .unwrap(),
    );
    let outer = Arc::new(ZooKeeperBackend::connect(&at("", "app")).await.unwrap());

    let inner = lock(&nested, "lock-0").acquire().await.unwrap();
    let inner_rw = lock(&nested_rw, "__WRIT__0000000000")
        .acquire()
        .await
        .unwrap();
    let children = admin.list_children("/app/x").await.unwrap();
    assert_eq!(children, ["lock-0"]);

    let x = lock(&outer, "x").try_acquire().await.unwrap();
    assert!(
        x.is_some(),
        "Lock(\"x\") is blocked by the directory /app/x/lock-0"
    );
    let read = rw_lock(&outer, "x").try_read().await.unwrap();
    assert!(
        read.is_some(),
        "RwLock(\"x\") is blocked by /app-rw/x/__WRIT__0000000000"
    );
    drop((x, read));
    inner.release().await.unwrap();
    inner_rw.release().await.unwrap();
}

/// Issue 31, case 7: a key with characters above U+FFFF (which the Java
/// server would see as surrogates, and refuse) is escaped per UTF-8 byte,
/// and works for locks, read-write locks and semaphores alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_above_u_ffff_work_for_locks_rw_locks_and_semaphores() {
    let fixture = ZkFixture::start().await;
    let (a, b) = (backend(&fixture).await, backend(&fixture).await);
    let key = "user:😀/𝄞";
    assert_eq!(
        a.lock_path(key).unwrap(),
        "/dlock/user:%F0%9F%98%80%2F%F0%9D%84%9E"
    );
    let guard = lock(&a, key).acquire().await.unwrap();
    assert_eq!(fixture.contenders(key).await.len(), 1);
    assert!(lock(&b, key).try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();

    let write = rw_lock(&a, key).write().await.unwrap();
    assert_eq!(fixture.rw_contenders(key).await.len(), 1);
    assert!(rw_lock(&b, key).try_read().await.unwrap().is_none());
    write.release().await.unwrap();
    let read = rw_lock(&a, key).read().await.unwrap();
    let read_b = rw_lock(&b, key)
        .try_read()
        .await
        .unwrap()
        .expect("readers share");
    read.release().await.unwrap();
    read_b.release().await.unwrap();

    let backend_a: Arc<dyn LockBackend> = a.clone();
    let backend_b: Arc<dyn LockBackend> = b.clone();
    let permit = dlock::Semaphore::new(key, 1)
        .with_backend(backend_a)
        .acquire()
        .await
        .unwrap();
    assert_eq!(fixture.permit_contenders(key).await.len(), 1);
    let second = dlock::Semaphore::new(key, 1)
        .with_backend(backend_b)
        .try_acquire()
        .await
        .unwrap();
    assert!(second.is_none());
    permit.release().await.unwrap();
}

/// A standalone server with a TLS port serving `certs`' server certificate
/// (and asking for a client certificate if `need_client_cert`).
async fn tls_server(certs: &TestCerts, need_client_cert: bool) -> ZkServer {
    let tls = ZkTls {
        cert: certs.server_cert_path().to_owned(),
        key: certs.server_key_path().to_owned(),
        ca: certs.ca_cert_path().to_owned(),
        need_client_cert,
    };
    tokio::task::spawn_blocking(move || ZkServer::start_tls(&tls))
        .await
        .expect("starting ZooKeeper with TLS panicked")
}

/// `zks://<host>:<TLS port>?ca=<ca>` plus `rest`.
fn zks_url(server: &ZkServer, host: &str, ca: &std::path::Path, rest: &str) -> String {
    format!(
        "zks://{host}:{}?ca={}&session_timeout={}ms{rest}",
        server.secure_port().expect("a TLS server"),
        ca.display(),
        SESSION_TIMEOUT.as_millis()
    )
}

/// A `connect` that must fail, within a bound: the error.
async fn refused(url: &str) -> LockError {
    let answer = tokio::time::timeout(Duration::from_secs(20), ZooKeeperBackend::connect(url))
        .await
        .unwrap_or_else(|_| panic!("connect({url}) hung"));
    match answer {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e,
    }
}

/// Issue 31, case 5: `zks://` locks over TLS (with digest credentials, which
/// then never cross the wire in clear text, and a client certificate the
/// server demands), with fencing tokens; without the client certificate the
/// server refuses the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_locks_with_fencing_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCerts::generate(dir.path()).unwrap();
    let server = tls_server(&certs, true).await;
    let identity = format!(
        "&cert={}&key={}",
        certs.client_cert_path().display(),
        certs.client_key_path().display()
    );
    let url = zks_url(&server, "127.0.0.1", certs.ca_cert_path(), &identity).replacen(
        "zks://",
        "zks://app:pw-over-tls@",
        1,
    );
    let a = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    let b = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    assert!(!a.describe().contains("pw-over-tls"), "{}", a.describe());
    let first = lock(&a, "over-tls").acquire().await.unwrap();
    let fence = first.fencing_token().expect("a fencing token");
    assert!(lock(&b, "over-tls").try_acquire().await.unwrap().is_none());
    first.release().await.unwrap();
    let second = lock(&b, "over-tls").try_acquire().await.unwrap().unwrap();
    assert!(second.fencing_token().unwrap() > fence);
    second.release().await.unwrap();

    let localhost = zks_url(&server, "localhost", certs.ca_cert_path(), &identity);
    let by_name = ZooKeeperBackend::connect(&localhost).await.unwrap();
    drop(by_name);
    let no_cert = zks_url(&server, "127.0.0.1", certs.ca_cert_path(), "");
    let err = refused(&no_cert).await;
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

/// `zks://` refuses a server whose certificate an unknown CA signed, and one
/// whose certificate names another host; a `zks://` URL without `?ca=` is an
/// `InvalidOption` before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_refuses_an_unknown_ca_and_a_wrong_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCerts::generate(&dir.path().join("good").tap_mkdir()).unwrap();
    let stranger = TestCerts::generate(&dir.path().join("stranger").tap_mkdir()).unwrap();
    let server = tls_server(&certs, false).await;
    let err = refused(&zks_url(&server, "127.0.0.1", stranger.ca_cert_path(), "")).await;
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("over TLS"), "{err}");

    let elsewhere = TestCerts::generate_for_host(
        &dir.path().join("elsewhere").tap_mkdir(),
        "elsewhere.invalid",
    )
    .unwrap();
    let misnamed = tls_server(&elsewhere, false).await;
    for host in ["127.0.0.1", "localhost"] {
        let err = refused(&zks_url(&misnamed, host, elsewhere.ca_cert_path(), "")).await;
        assert!(matches!(err, LockError::Backend { .. }), "{host}: {err:?}");
    }
    // The servers saw the client end each handshake with an alert: the
    // refusals are TLS's, not a server that was not there.
    for server in [&server, &misnamed] {
        let log = server.process().log_tail();
        assert!(log.contains("Received fatal alert"), "{log}");
    }
    // The same CA and port, with the name checked right, connect: the
    // refusals above are the CA's and the name's.
    ZooKeeperBackend::connect(&zks_url(&server, "127.0.0.1", certs.ca_cert_path(), ""))
        .await
        .unwrap();

    let port = server.secure_port().unwrap();
    for (url, says) in [
        (format!("zks://127.0.0.1:{port}"), "?ca="),
        (format!("zks://app:pw@127.0.0.1:{port}?ca="), "PEM file"),
        (
            format!("zks://127.0.0.1:{port}?ca=/nonexistent/ca.pem"),
            "cannot read the CA file",
        ),
    ] {
        let err = refused(&url).await;
        assert!(
            matches!(err, LockError::InvalidOption { .. }),
            "{url}: {err:?}"
        );
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}

/// Creates the directory (for certificates) and returns it.
trait TapMkdir {
    fn tap_mkdir(self) -> std::path::PathBuf;
}

impl TapMkdir for std::path::PathBuf {
    fn tap_mkdir(self) -> std::path::PathBuf {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}
