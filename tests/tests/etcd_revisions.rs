//! How many etcd revisions each operation costs (issue 68): etcd keeps every
//! revision until the server compacts, so the revisions per lock cycle are
//! what fills its quota. Each test reads the store's revision (a read's
//! response header) before and after, and asserts the protocol's minimum.
//!
//! The minimum: etcd adds one revision per committed write transaction that
//! changes a key (one for the whole transaction, whatever its number of
//! puts and deletes). Reads, transactions whose compare failed, lease
//! grants and keep-alives add none; a lease revoke adds one only if keys
//! were attached to the lease. A dlock lock (or permit) *is* a key in the
//! lock's queue directory, on the backend's session lease: its create
//! revision orders the queue and is the fencing token, its lease ties it to
//! the holder's liveness. So:
//! - an uncontended cycle is 2: the transaction that creates the key (and
//!   reads the queue in the same transaction) and the release's
//!   compare-and-delete. No lock can cost less: taking it must write
//!   something others see, and letting go must remove it (a revoke of the
//!   lease instead would cost the same one revision, and the lease is shared
//!   by every key of its ttl);
//! - a contended hand-off is 1: the holder's delete. The waiter's key was
//!   written when it queued (its acquisition's one write) and it is granted
//!   by its place in line, with no write of its own;
//! - a renewal is 0: a keep-alive of the session lease and a read of the key;
//! - a permit cycle of a semaphore is 2, as a lock's; a read or write cycle of
//!   a read-write lock is 2 as well.
//!
//! The figure for the guide: N cycles per second cost 2N revisions per
//! second, 7,200 N per hour (`dlock::guide::backends`, etcd).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Renewal};
use dlock::backends::etcd::SESSION_IDLE;
use dlock::{Lock, LockBackend, RwLock, Semaphore};
use dlock_tests::servers::etcd::EtcdServer;

/// Cycles per measure: enough that one stray write would show, few enough
/// for a quick test.
const CYCLES: i64 = 50;

struct Revisions {
    client: etcd_client::Client,
}

impl Revisions {
    async fn of(server: &EtcdServer) -> Self {
        let client = etcd_client::Client::connect([server.endpoint()], None)
            .await
            .expect("connect the revision reader");
        Revisions { client }
    }

    /// The store's current revision (a read: it costs none).
    async fn now(&mut self) -> i64 {
        let answer = self
            .client
            .kv_client()
            .get("dlock-test-revision-probe", None)
            .await
            .expect("read the revision");
        answer.header().expect("a response header").revision()
    }

    /// The backend database's size in bytes, as `etcdctl endpoint status`.
    async fn db_size(&mut self) -> i64 {
        self.client
            .maintenance_client()
            .status()
            .await
            .expect("endpoint status")
            .db_size()
    }

    /// How many leases the server has.
    async fn leases(&mut self) -> usize {
        self.client
            .lease_client()
            .leases()
            .await
            .expect("list the leases")
            .leases()
            .len()
    }

    /// Waits (bounded) until the revision is at least `at`: a waiter's key
    /// written in the background.
    async fn until(&mut self, at: i64) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.now().await;
            if now >= at || Instant::now() > deadline {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn connect(server: &EtcdServer) -> Arc<dyn LockBackend> {
    dlock::connect(&server.url())
        .await
        .expect("connect to the test server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_lock_cycle_costs_two_revisions() {
    let server = EtcdServer::start();
    let mut revisions = Revisions::of(&server).await;
    let backend = connect(&server).await;
    // The first cycle grants the session lease: a lease costs no revision.
    let before = revisions.now().await;
    let lock = Lock::new("cycles").with_backend(backend.clone());
    lock.acquire().await.unwrap().release().await.unwrap();
    let first = revisions.now().await - before;
    eprintln!("etcd: the first lock cycle (session lease granted): {first} revisions");
    assert_eq!(first, 2, "the first cycle, lease grant included");

    // More cycles here: the database file grows by pages, so its growth
    // per cycle (printed, for the guide's figure) needs a few hundred.
    const MANY: i64 = 10 * CYCLES;
    let (before, size_before) = (revisions.now().await, revisions.db_size().await);
    let started = Instant::now();
    for i in 0..MANY {
        // Half on one key, half on a key each: a key's directory is no cost.
        let name = if i % 2 == 0 {
            "cycles".to_owned()
        } else {
            format!("cycles-{i}")
        };
        let guard = Lock::new(name)
            .with_backend(backend.clone())
            .acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    let took = started.elapsed();
    let spent = revisions.now().await - before;
    let grown = revisions.db_size().await - size_before;
    eprintln!(
        "etcd: {MANY} uncontended lock cycles in {took:?}: {spent} revisions ({:.2} per cycle), database file +{grown} bytes ({:.0} per revision)",
        spent as f64 / MANY as f64,
        grown as f64 / spent.max(1) as f64
    );
    assert_eq!(spent, 2 * MANY, "2 revisions per cycle");

    // The session lease, idle, is revoked (`SESSION_IDLE`): no key is on it
    // any more, so the revoke deletes nothing and costs no revision.
    let (idle_from, leases) = (revisions.now().await, revisions.leases().await);
    tokio::time::sleep(SESSION_IDLE + Duration::from_secs(2)).await;
    let idle = revisions.now().await - idle_from;
    let leases_left = revisions.leases().await;
    eprintln!(
        "etcd: the idle session's revoke ({leases} lease(s), then {leases_left}): {idle} revisions"
    );
    assert_eq!(
        (leases, leases_left),
        (1, 0),
        "the session's lease, revoked"
    );
    assert_eq!(idle, 0, "a revoke of a lease with no key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_hand_off_costs_the_holders_delete() {
    let server = EtcdServer::start();
    let mut revisions = Revisions::of(&server).await;
    let (a, b) = (connect(&server).await, connect(&server).await);
    let mut figures = Vec::new();
    for round in 0..10 {
        let start = revisions.now().await;
        let held = Lock::new("handed")
            .with_backend(a.clone())
            .acquire()
            .await
            .unwrap();
        let holding = revisions.now().await;
        let waiter = {
            let lock = Lock::new("handed")
                .with_backend(b.clone())
                .wait(Duration::from_secs(20));
            tokio::spawn(async move { lock.acquire().await })
        };
        // The waiter's key is its one write.
        let queued = revisions.until(holding + 1).await;
        held.release().await.unwrap();
        let second = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("the waiter is granted")
            .expect("the waiting task")
            .expect("the waiter's acquire");
        let handed = revisions.now().await;
        second.release().await.unwrap();
        let end = revisions.now().await;
        figures.push((
            holding - start,
            queued - holding,
            handed - queued,
            end - handed,
        ));
        assert_eq!(
            (
                holding - start,
                queued - holding,
                handed - queued,
                end - handed
            ),
            (1, 1, 1, 1),
            "round {round}: A's key, B's key, the hand-off (A's delete), B's release"
        );
    }
    eprintln!(
        "etcd: contended hand-offs, revisions per step (A's acquire, B queued, hand-off, B's release): {figures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_costs_no_revision() {
    let server = EtcdServer::start();
    let mut revisions = Revisions::of(&server).await;
    let backend = connect(&server).await;
    let request = AcquireRequest {
        key: "renewed".into(),
        token: "0123456789abcdef0123456789abcdef".into(),
        ttl: Duration::from_secs(3),
    };
    let lease = backend
        .try_acquire(&request)
        .await
        .unwrap()
        .expect("a free key");
    let before = revisions.now().await;
    for _ in 0..CYCLES {
        let renewed = backend.renew(std::slice::from_ref(&lease)).await;
        assert!(
            matches!(renewed[..], [Ok(Renewal::Renewed { .. })]),
            "{renewed:?}"
        );
    }
    let direct = revisions.now().await - before;
    // Released before the watchdog's part: a key no guard renews is deleted
    // by the session's next keep-alive once its local deadline passed (a
    // write, and the right one: `etcd/held.rs`, keys that outlived it).
    assert!(backend.release(&lease).await.unwrap());
    // And the watchdog's own renewals of a guard (ttl 3 s: one a second).
    let guard = Lock::new("watched")
        .ttl(Duration::from_secs(3))
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    let held_from = revisions.now().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        guard.is_held(),
        "the guard's lease renewed for 5 s (ttl 3 s)"
    );
    let by_watchdog = revisions.now().await - held_from;
    eprintln!(
        "etcd: {CYCLES} renewals: {direct} revisions; a guard renewed by the watchdog for 5 s (ttl 3 s): {by_watchdog}"
    );
    assert_eq!(direct, 0, "renewals write nothing");
    assert_eq!(by_watchdog, 0, "the watchdog's renewals write nothing");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_cycle_and_a_read_write_cycle_cost_two_revisions() {
    let server = EtcdServer::start();
    let mut revisions = Revisions::of(&server).await;
    let backend = connect(&server).await;
    let semaphore = Semaphore::new("permits", 3).with_backend(backend.clone());
    // Warm: the session lease (no revision, but the first cycle is apart).
    semaphore.acquire().await.unwrap().release().await.unwrap();
    let before = revisions.now().await;
    for _ in 0..CYCLES {
        semaphore.acquire().await.unwrap().release().await.unwrap();
    }
    let permits = revisions.now().await - before;

    let rw = RwLock::new("shared").with_backend(backend.clone());
    let before = revisions.now().await;
    for i in 0..CYCLES {
        let guard = if i % 2 == 0 {
            rw.read().await
        } else {
            rw.write().await
        };
        guard.unwrap().release().await.unwrap();
    }
    let read_write = revisions.now().await - before;
    eprintln!(
        "etcd: {CYCLES} permit cycles: {permits} revisions; {CYCLES} read/write cycles: {read_write} revisions"
    );
    assert_eq!(permits, 2 * CYCLES, "2 revisions per permit cycle");
    assert_eq!(
        read_write,
        2 * CYCLES,
        "2 revisions per read or write cycle"
    );
}
