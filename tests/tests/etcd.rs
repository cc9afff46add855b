//! etcd-specific behaviour on real etcd servers: FIFO fairness, interop with
//! `etcdctl lock` both ways, deeper keys (another resource's) ignored, a
//! leader killed under a held lock, the whole cluster stopped, a holder
//! process killed with SIGKILL, auth and TLS.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, PermitRequest, Renewal};
use dlock::backends::etcd::EtcdBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::acquisitions::{acquire_and_release, got_within, wait_for};
use dlock_tests::fixtures::etcd::{queue_prefix, EtcdFixture};
use dlock_tests::holder::{Holder, HolderSpec};
use dlock_tests::overlap::OverlapDetector;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::etcd::{EtcdServer, ETCD_PACKAGES};
use dlock_tests::servers::process::require_binary;
use dlock_tests::urls::invalid_option;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        EtcdBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
    )
}

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// Runs blocking harness work (etcdctl, killing servers) without stalling the runtime.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(work)
}

/// Polls (bounded) until the server-side queue of `key` has `len` entries.
async fn wait_for_queue(fixture: &EtcdFixture, key: &str, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queue = blocking(|| fixture.queue(key));
        if queue.len() >= len {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the queue of {key} never reached {len} entries: {queue:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waiters, each its own client, queued one after another behind a holder;
/// each records when it gets the lock and holds it for a moment.
struct QueuedWaiters {
    count: usize,
    order: Arc<Mutex<Vec<usize>>>,
    overlap: Arc<OverlapDetector>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl QueuedWaiters {
    /// Starts `count` waiters on `key`, each with the lock `lock_for` makes
    /// on its own client, and holding it for `hold`. Waiter i is on the
    /// server before waiter i+1 starts.
    async fn queue(
        fixture: &EtcdFixture,
        key: &str,
        count: usize,
        lock_for: impl Fn(&Arc<dyn LockBackend>) -> Lock,
        hold: Duration,
    ) -> Self {
        let order = Arc::new(Mutex::new(Vec::new()));
        let overlap = Arc::new(OverlapDetector::default());
        let mut tasks = Vec::new();
        for i in 0..count {
            let lock = lock_for(&connect(fixture.url()).await);
            let (order, overlap) = (order.clone(), overlap.clone());
            tasks.push(tokio::spawn(async move {
                let guard = lock.acquire().await.expect("a waiter did not get the lock");
                overlap.enter();
                order.lock().unwrap().push(i);
                tokio::time::sleep(hold).await;
                overlap.leave();
                guard.release().await.unwrap();
            }));
            wait_for_queue(fixture, key, i + 2).await;
        }
        QueuedWaiters {
            count,
            order,
            overlap,
            tasks,
        }
    }

    /// All the waiters finish within 30 s, got the lock in the order they
    /// queued in, and never two at once.
    async fn are_served_in_order(self) {
        tokio::time::timeout(Duration::from_secs(30), async {
            for task in self.tasks {
                task.await.expect("a waiter panicked");
            }
        })
        .await
        .expect("the waiters did not finish within 30 s");
        assert_eq!(
            *self.order.lock().unwrap(),
            (0..self.count).collect::<Vec<_>>()
        );
        assert_eq!(self.overlap.overlaps(), 0);
    }
}

/// Ten waiters, each its own client, queue one after another behind a holder
/// and get the lock in exactly that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_first_come_first_served() {
    const WAITERS: usize = 10;
    let fixture = EtcdFixture::single();
    let key = "fair";
    let holder = connect(fixture.url()).await;
    let held = lock(&holder, key).acquire().await.unwrap();
    let waiters = QueuedWaiters::queue(
        &fixture,
        key,
        WAITERS,
        |backend| lock(backend, key).wait(Duration::from_secs(30)),
        Duration::from_millis(10),
    )
    .await;
    held.release().await.unwrap();
    waiters.are_served_in_order().await;
    assert!(
        blocking(|| fixture.queue(key)).is_empty(),
        "entries left behind"
    );
}

/// `etcdctl lock <name>` as a child process; it prints the key it holds
/// once it has the lock, and gives it back on SIGTERM.
struct Etcdctl {
    child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Etcdctl {
    fn lock(endpoints: &str, name: &str) -> Self {
        let ctl = require_binary("etcdctl", ETCD_PACKAGES).unwrap_or_else(|e| panic!("{e}"));
        let mut child = Command::new(ctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["lock", name])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn etcdctl lock");
        let stdout = child.stdout.take().expect("piped stdout");
        Etcdctl {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The key etcdctl printed when it got the lock, if it did within `limit`.
    async fn acquired_within(&mut self, limit: Duration) -> Option<String> {
        match tokio::time::timeout(limit, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Some(line),
            Ok(other) => panic!("etcdctl lock ended without the lock: {other:?}"),
            Err(_) => None,
        }
    }

    /// SIGTERM: etcdctl unlocks and revokes its session, then exits (bounded).
    async fn unlock(mut self) {
        let pid = self.child.id().expect("etcdctl is running") as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("signal etcdctl");
        tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .expect("etcdctl did not exit within 5 s of SIGTERM")
            .expect("wait for etcdctl");
    }
}

/// While we hold `key`, `etcdctl lock <name>` waits (1.5 s); after our
/// release it gets the lock (within 5 s). Returns etcdctl, holding it, and
/// the key it printed.
async fn etcdctl_gets_it_after_our_release(
    ours: &Arc<dyn LockBackend>,
    key: &str,
    endpoints: &str,
    name: &str,
) -> (Etcdctl, String) {
    let guard = lock(ours, key).acquire().await.unwrap();
    let mut theirs = Etcdctl::lock(endpoints, name);
    assert_eq!(
        theirs.acquired_within(Duration::from_millis(1500)).await,
        None,
        "etcdctl got the lock while we held it"
    );
    guard.release().await.unwrap();
    let their_key = theirs
        .acquired_within(Duration::from_secs(5))
        .await
        .expect("etcdctl did not get the lock after our release");
    (theirs, their_key)
}

/// While we hold `order:42`, `etcdctl lock dlock/order:42` waits; after our
/// release it gets the lock; then we wait for it, and get the lock when it
/// lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excludes_and_follows_etcdctl_lock_both_ways() {
    let fixture = EtcdFixture::single();
    let endpoints = fixture.url().trim_start_matches("etcd://").to_owned();
    let key = "order:42";
    let name = queue_prefix(key).trim_end_matches('/').to_owned();
    let ours = connect(fixture.url()).await;

    let (theirs, their_key) =
        etcdctl_gets_it_after_our_release(&ours, key, &endpoints, &name).await;
    assert!(their_key.starts_with(&queue_prefix(key)), "{their_key}");

    // Now etcdctl holds it: we neither get it at once nor within a short wait.
    assert!(lock(&ours, key).try_acquire().await.unwrap().is_none());
    let err = lock(&ours, key)
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let waiting = wait_for(lock(&ours, key).wait(Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let let_go = Instant::now();
    theirs.unlock().await;
    let guard = got_within(
        waiting,
        let_go,
        Duration::from_secs(2),
        "we did not get the lock after etcdctl let go",
    )
    .await;
    guard.release().await.unwrap();
}

/// A key with `/` is the `etcdctl lock` of its escaped name
/// (`dlock/tenant%2F7`), which `queue_prefix` gives: etcdctl waits while we
/// hold it and gets it after our release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_a_slash_is_the_etcdctl_lock_of_its_escaped_name() {
    let fixture = EtcdFixture::single();
    let endpoints = fixture.url().trim_start_matches("etcd://").to_owned();
    let key = "tenant/7";
    let etcd = EtcdBackend::connect(fixture.url()).await.unwrap();
    assert_eq!(etcd.queue_prefix(key), "dlock/tenant%2F7/");
    let ours: Arc<dyn LockBackend> = Arc::new(etcd);

    let (theirs, their_key) =
        etcdctl_gets_it_after_our_release(&ours, key, &endpoints, "dlock/tenant%2F7").await;
    assert!(their_key.starts_with("dlock/tenant%2F7/"), "{their_key}");
    assert!(lock(&ours, key).try_acquire().await.unwrap().is_none());
    theirs.unlock().await;
}

/// A 3-member cluster loses its leader while a guard is held and three
/// waiters queue: the guard stays held (keep-alive moves to another member),
/// and the waiters get the lock in their order afterwards, never two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_held_keeps_the_lock_and_the_order() {
    let mut fixture = EtcdFixture::cluster(3);
    let key = "leader";
    let ttl = Duration::from_secs(5);
    let holder = connect(fixture.url()).await;
    let held = lock(&holder, key).ttl(ttl).acquire().await.unwrap();
    let lost = held.lost();
    let waiters = QueuedWaiters::queue(
        &fixture,
        key,
        3,
        |backend| lock(backend, key).ttl(ttl).wait(Duration::from_secs(60)),
        Duration::from_millis(50),
    )
    .await;

    let cluster = fixture.cluster_mut();
    let leader = blocking(|| cluster.wait_for_leader(Duration::from_secs(10))).unwrap();
    blocking(|| cluster.member_mut(leader).kill9());
    let new_leader = blocking(|| cluster.wait_for_leader(Duration::from_secs(15))).unwrap();
    assert_ne!(new_leader, leader);

    // Hold on for two more ttls: only working renewals keep the lease that long.
    let watch_until = Instant::now() + ttl * 2;
    tokio::select! {
        () = lost => panic!("the guard was lost when the leader died"),
        () = tokio::time::sleep_until(watch_until.into()) => {}
    }
    assert!(held.is_held());
    held.release()
        .await
        .expect("release after the leader change");
    waiters.are_served_in_order().await;
}

/// With every member stopped, the guard reports the loss before its ttl
/// runs out locally, and `acquire` fails with `Backend` within its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_stopped_loses_the_lease_and_fails_acquire() {
    let mut fixture = EtcdFixture::cluster(3);
    let ttl = Duration::from_secs(2);
    let backend = connect(fixture.url()).await;
    let guard = lock(&backend, "down").ttl(ttl).acquire().await.unwrap();
    let lost = guard.lost();
    // Let one renewal go through so the deadline comes from a keep-alive.
    tokio::time::sleep(ttl / 2).await;
    let cluster = fixture.cluster_mut();
    let stopped_at = Instant::now();
    blocking(|| {
        for i in 0..cluster.len() {
            cluster.member_mut(i).stop();
        }
    });
    tokio::time::timeout(ttl, lost)
        .await
        .expect("lost() did not fire within the ttl of the cluster stopping");
    assert!(
        stopped_at.elapsed() <= ttl,
        "lost after {:?}",
        stopped_at.elapsed()
    );
    assert!(!guard.is_held());
    drop(guard);

    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        wait + Duration::from_secs(2),
        lock(&backend, "down-2").ttl(ttl).wait(wait).acquire(),
    )
    .await
    .expect("acquire hung on a stopped cluster");
    let err = outcome.expect_err("acquired a lock on a stopped cluster");
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(
        started.elapsed() <= wait + Duration::from_millis(500),
        "acquire took {:?} with a wait of {wait:?}",
        started.elapsed()
    );
    // A transport failure is never "someone else holds it".
    let err = lock(&backend, "down-3").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    // Without a wait, acquire gives up once etcd has not answered for a ttl.
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        ttl + Duration::from_secs(5),
        lock(&backend, "down-4").ttl(ttl).acquire(),
    )
    .await
    .expect("an acquire without a wait hung on a stopped cluster");
    let err = outcome.expect_err("acquired a lock on a stopped cluster");
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(
        started.elapsed() >= ttl / 2,
        "gave up after {:?}",
        started.elapsed()
    );
}

/// A holder process killed with SIGKILL keeps the lock until its lease
/// expires on the server, and not much longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_lock_when_its_lease_expires() {
    let fixture = EtcdFixture::single();
    let key = "crash";
    let ttl = Duration::from_secs(2);
    let mut holder = Holder::spawn(
        env!("CARGO_BIN_EXE_lock-holder"),
        &HolderSpec::once(fixture.url(), key, ttl, Duration::from_secs(60)),
    );
    holder.acquired(Duration::from_secs(10)).await;
    // Let it renew a few times, so its lease was last extended just before the kill.
    tokio::time::sleep(ttl).await;

    let ours = connect(fixture.url()).await;
    let waiting = wait_for(lock(&ours, key).wait(Duration::from_secs(15)));
    wait_for_queue(&fixture, key, 2).await;
    let killed_at = Instant::now();
    holder.kill9().await;
    let (got_at, guard) = waiting.await.unwrap();
    let guard = guard.expect("the waiter never got the lock");
    let after = got_at - killed_at;
    // The holder renews every ttl/3, so its lease ends between 2/3 ttl and
    // one ttl after the kill; etcd checks expiry every 500 ms.
    assert!(
        after >= ttl * 2 / 3 - Duration::from_millis(100),
        "taken {after:?} after the kill: before the lease expired"
    );
    assert!(
        after <= ttl + Duration::from_secs(1),
        "taken {after:?} after the kill"
    );
    guard.release().await.unwrap();
}

/// User/password auth: the right password works, a wrong one is a `Backend`
/// error that does not show the password, and `describe()` hides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_auth() {
    let server = EtcdServer::start();
    blocking(|| {
        server.etcdctl(&["user", "add", "root:R00t-pw"]);
        server.etcdctl(&["auth", "enable"]);
    });
    let url = format!("etcd://root:R00t-pw@{}", server.endpoint());
    let backend = connect(&url).await;
    assert_eq!(
        backend.describe(),
        format!("etcd://root:***@{}", server.endpoint())
    );
    let guard = lock(&backend, "auth").acquire().await.unwrap();
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();

    let wrong = format!("etcd://root:not-the-Pw@{}", server.endpoint());
    let err = EtcdBackend::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("not-the-Pw"), "{shown}");
}

/// A URL that cannot work is a clear `InvalidOption`, never a panic.
#[tokio::test]
async fn bad_urls_are_invalid_options() {
    for url in [
        "etcd://",
        "etcd://h:99999",
        "etcd://h?nope=1",
        "etcds://h:2379",
        "etcds://h:2379?ca=/nonexistent/ca.pem",
    ] {
        invalid_option(url).await;
    }
    // Nothing listens there: a transport failure, reported as such.
    let port = dlock_tests::servers::ports::free_port().unwrap();
    let err = dlock::connect(&format!("etcd://127.0.0.1:{port}?timeout=1s"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

/// `etcds://` with a CA file: a TLS-only member is reached and locks work;
/// a plain `etcd://` URL to the same port is a `Backend` error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_file() {
    use dlock_tests::servers::ports::free_port;
    use dlock_tests::servers::process::{ProcessSpec, ServerProcess};
    use dlock_tests::tls::TestCerts;

    let dir = tempfile::tempdir().unwrap();
    let certs = TestCerts::generate(dir.path()).unwrap();
    let (client_port, peer_port) = (free_port().unwrap(), free_port().unwrap());
    let client_url = format!("https://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let etcd = require_binary("etcd", ETCD_PACKAGES).unwrap_or_else(|e| panic!("{e}"));
    let spec = ProcessSpec::new("etcd tls", etcd, dir.path().join("etcd.log"))
        .args(["--name", "tls", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("tls={peer_url}")])
        .arg("--cert-file")
        .arg(certs.server_cert_path())
        .arg("--key-file")
        .arg(certs.server_key_path());
    let _server = ServerProcess::spawn(spec).unwrap();

    let url = format!(
        "etcds://127.0.0.1:{client_port}?ca={}&timeout=2s",
        certs.ca_cert_path().display()
    );
    // Ready when a TLS client gets through (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    let a: Arc<dyn LockBackend> = loop {
        match EtcdBackend::connect(&url).await {
            Ok(backend) => break Arc::new(backend),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the TLS etcd never answered: {e}"),
        }
    };
    let b = connect(&url).await;
    let guard = lock(&a, "tls").acquire().await.unwrap();
    assert!(lock(&b, "tls").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    assert!(lock(&b, "tls").try_acquire().await.unwrap().is_some());

    let plain = format!("etcd://127.0.0.1:{client_port}?timeout=2s");
    let err = tokio::time::timeout(Duration::from_secs(10), EtcdBackend::connect(&plain))
        .await
        .expect("a plain connect to a TLS port hung")
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

/// A waiter whose `acquire` is dropped leaves no entry in the server's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_deletes_its_queue_entry() {
    let fixture = EtcdFixture::single();
    let key = "dropped";
    let (a, b) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let held = lock(&a, key).acquire().await.unwrap();
    let waiter = lock(&b, key);
    let dropped = tokio::time::timeout(Duration::from_millis(500), waiter.acquire()).await;
    assert!(
        dropped.is_err(),
        "the waiter should still have been waiting"
    );
    let holder_only = blocking(|| fixture.queue(key));
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let queue = blocking(|| fixture.queue(key));
        if queue.len() == 1 {
            assert_eq!(queue, holder_only[..1], "the holder's entry must stay");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped waiter's entry stayed: {queue:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
    assert!(blocking(|| fixture.queue(key)).is_empty());
}

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

/// A paused (SIGSTOP) member answers nothing and closes nothing: the guard is
/// lost by its local deadline, and a waiting `acquire` ends with `Backend`
/// (etcd silent), not `Timeout` (lock busy), within its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_member_loses_the_lease_and_fails_acquire() {
    let mut fixture = EtcdFixture::single();
    let ttl = Duration::from_secs(2);
    let backend = connect(fixture.url()).await;
    let guard = lock(&backend, "paused").ttl(ttl).acquire().await.unwrap();
    let lost = guard.lost();
    let paused_at = Instant::now();
    blocking(|| fixture.cluster_mut().member_mut(0).pause());
    tokio::time::timeout(ttl, lost)
        .await
        .expect("lost() did not fire within the ttl of the member pausing");
    assert!(
        paused_at.elapsed() <= ttl,
        "lost after {:?}",
        paused_at.elapsed()
    );

    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let err = lock(&backend, "paused-2")
        .ttl(ttl)
        .wait(wait)
        .acquire()
        .await
        .expect_err("acquired a lock on a paused member");
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(
        started.elapsed() <= wait + Duration::from_millis(500),
        "acquire took {:?} with a wait of {wait:?}",
        started.elapsed()
    );
    blocking(|| fixture.cluster_mut().member_mut(0).resume());
    drop(guard);
}

/// A holder's `release()` polled once and then dropped (a caller's `timeout`
/// or `select!` around it) hands the key to the next local waiter only once
/// the old key is settled: the waiter holds a key of its own on the server,
/// with a larger fencing token, and another client never holds the key at
/// the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_never_gives_two_holders() {
    // The old failure depended on etcd applying the waiter's enqueue before
    // the cancelled delete (one round in three to five): enough rounds that
    // the old code cannot pass.
    const ROUNDS: usize = 30;
    let fixture = EtcdFixture::single();
    let (a, b) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let overlap = Arc::new(OverlapDetector::default());
    let mut problems = Vec::new();
    let mut failed_rounds = 0;
    let mut cut_rounds = 0;
    for round in 0..ROUNDS {
        let key = format!("cancelled-release-{round}");
        let first = lock(&a, &key).acquire().await.unwrap();
        let first_fence = first.fencing_token().unwrap();
        let waiter = tokio::spawn({
            let lock = lock(&a, &key).wait(Duration::from_secs(10));
            async move { lock.acquire().await }
        });
        // Let the waiter queue on the local gate.
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Cut after its first poll. On a loaded machine the answer can be
        // back within that one poll (the connection's worker runs on dlock's
        // own thread): then the round checks an ordinary release, and the
        // count below makes sure most rounds were cut.
        let cut = tokio::time::timeout(Duration::ZERO, first.release()).await;
        cut_rounds += usize::from(cut.is_err());
        let second = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the local waiter did not get the key within 10 s")
            .unwrap()
            .expect("the local waiter's acquire failed");
        overlap.enter();
        let before = overlap.overlaps();
        // Another process contends while A's waiter holds the key.
        let contender = tokio::spawn({
            let (lock, overlap) = (
                lock(&b, &key).wait(Duration::from_secs(20)),
                overlap.clone(),
            );
            async move {
                let guard = lock.acquire().await.expect("the other client's acquire");
                overlap.enter();
                tokio::time::sleep(Duration::from_millis(10)).await;
                overlap.leave();
                guard.release().await.expect("the other client's release");
            }
        });
        // Long enough for the cancelled release's delete to land.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fence = second.fencing_token().unwrap();
        let queue = blocking(|| fixture.queue_revisions(&key));
        let held = second.is_held();
        overlap.leave();
        let problems_before = problems.len();
        if overlap.overlaps() > before {
            problems.push(format!("round {round}: the other client held the key too"));
        }
        if fence <= first_fence {
            problems.push(format!(
                "round {round}: the waiter's fence {fence} is not above the released {first_fence}"
            ));
        }
        if queue.first().map(|(_, revision)| *revision) != Some(fence as i64) {
            problems.push(format!(
                "round {round}: the waiter (fence {fence}, held: {held}) is not the holder on the server: {queue:?}"
            ));
        }
        failed_rounds += usize::from(problems.len() > problems_before);
        let _ = second.release().await;
        tokio::time::timeout(Duration::from_secs(30), contender)
            .await
            .expect("the other client did not finish within 30 s")
            .expect("the other client panicked");
    }
    assert!(
        problems.is_empty(),
        "{failed_rounds} of {ROUNDS} rounds failed:\n{}",
        problems.join("\n")
    );
    assert!(
        cut_rounds >= ROUNDS / 2,
        "the release ended in one poll in {} of {ROUNDS} rounds: the cancelled path was hardly tried",
        ROUNDS - cut_rounds
    );
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

/// A raw etcd client on the fixture's member, as another program would use.
async fn raw_client(fixture: &EtcdFixture) -> etcd_client::Client {
    let endpoint = fixture.url().trim_start_matches("etcd://").to_owned();
    tokio::time::timeout(
        Duration::from_secs(5),
        etcd_client::Client::connect([endpoint], None),
    )
    .await
    .expect("connect within 5 s")
    .expect("connect a raw etcd client")
}

/// `tenant` and `tenant/7` are different names: while `etcdctl lock
/// dlock/tenant/7` holds (its key `dlock/tenant/7/<lease>` lies inside the
/// range of `dlock/tenant/`), `Lock("tenant")` is free, and a waiter for
/// `tenant` watches the holder of `tenant`, not etcdctl's younger, deeper
/// key: it gets the lock at our release, while etcdctl still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeper_etcdctl_lock_is_another_resource() {
    let fixture = EtcdFixture::single();
    let endpoints = fixture.url().trim_start_matches("etcd://").to_owned();
    let (first, second) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let held = lock(&first, "tenant").acquire().await.unwrap();
    let mut theirs = Etcdctl::lock(&endpoints, "dlock/tenant/7");
    let their_key = theirs
        .acquired_within(Duration::from_secs(5))
        .await
        .expect("etcdctl lock dlock/tenant/7 is another lock than ours");
    assert!(their_key.starts_with("dlock/tenant/7/"), "{their_key}");
    // Our holder of `tenant` is first; etcdctl's deeper key is younger.
    assert!(lock(&second, "tenant")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let waiting = wait_for(lock(&second, "tenant").wait(Duration::from_secs(5)));
    wait_for_queue(&fixture, "tenant", 3).await; // ours, etcdctl's (deeper), the waiter's
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = got_within(
        waiting,
        released,
        Duration::from_secs(2),
        "the waiter watched etcdctl's deeper key, not our holder",
    )
    .await;
    guard.release().await.unwrap();
    // etcdctl still holds `tenant/7`: `tenant` is free.
    let again = lock(&first, "tenant").try_acquire().await.unwrap();
    assert!(
        again.is_some(),
        "etcdctl's lock of dlock/tenant/7 blocked `tenant`"
    );
    again.unwrap().release().await.unwrap();
    theirs.unlock().await;
}

/// Writes `keys` with a raw client (no lease), as another program would.
async fn put_foreign(fixture: &EtcdFixture, keys: &[String]) -> etcd_client::Client {
    let mut raw = raw_client(fixture).await;
    for key in keys {
        raw.put(key.as_str(), "foreign", None).await.unwrap();
    }
    raw
}

/// The foreign keys are still there.
async fn untouched(raw: &mut etcd_client::Client, keys: &[String]) {
    for key in keys {
        let got = raw.get(key.as_str(), None).await.unwrap();
        assert_eq!(got.kvs().len(), 1, "{key} was deleted");
    }
}

/// More keys one level deeper than a lock's entries than one read's page
/// (a raw client's, another resource's): none holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeper_keys_of_a_raw_client_hold_no_lock() {
    let fixture = EtcdFixture::single();
    let foreign: Vec<String> = (0..40).map(|i| format!("dlock/jobs/x/{i:02}")).collect();
    let mut raw = put_foreign(&fixture, &foreign).await;
    let (backend, other) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let guard = lock(&backend, "jobs").try_acquire().await.unwrap();
    let guard = guard.expect("deeper keys under dlock/jobs/ held `jobs`");
    assert!(lock(&other, "jobs").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    untouched(&mut raw, &foreign).await;
}

/// A raw client's keys deeper than a read-write lock's entries
/// (`<dir>eu/write/<n>`, and a key below a `write/<n>`) are no reader and
/// no writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeper_keys_of_a_raw_client_hold_no_rw_lease() {
    let fixture = EtcdFixture::single();
    let foreign = [
        "dlock-rw/prices/eu/write/1".to_owned(),
        "dlock-rw/prices/write/1/read/2".to_owned(),
    ];
    let mut raw = put_foreign(&fixture, &foreign).await;
    let backend = connect(fixture.url()).await;
    let rw = || dlock::RwLock::new("prices").with_backend(backend.clone());
    let read = rw().try_read().await.unwrap();
    read.expect("a key below dlock-rw/prices/write/1 counted as a writer")
        .release()
        .await
        .unwrap();
    let write = rw().try_write().await.unwrap();
    let write = write.expect("a deeper key under dlock-rw/prices/ counted as a reader or writer");
    assert!(
        rw().try_read().await.unwrap().is_none(),
        "a read beside our write"
    );
    write.release().await.unwrap();
    untouched(&mut raw, &foreign).await;
}

/// More of a raw client's keys one level deeper than a semaphore's entries
/// than one read's page: none holds a permit, and a freed permit is found
/// past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeper_keys_of_a_raw_client_hold_no_permit() {
    let fixture = EtcdFixture::single();
    let foreign: Vec<String> = (0..40)
        .map(|i| format!("dlock-semaphores/jobs/eu/{i:02}"))
        .collect();
    let mut raw = put_foreign(&fixture, &foreign).await;
    let (backend, other) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let semaphore = dlock::Semaphore::new("jobs", 2).with_backend(backend.clone());
    let one = semaphore.try_acquire().await.unwrap();
    let two = semaphore.try_acquire().await.unwrap();
    assert!(
        one.is_some() && two.is_some(),
        "deeper keys under dlock-semaphores/jobs/ took its permits"
    );
    let others = dlock::Semaphore::new("jobs", 2).with_backend(other.clone());
    assert!(
        others.try_acquire().await.unwrap().is_none(),
        "a third permit"
    );
    one.unwrap().release().await.unwrap();
    let three = others.try_acquire().await.unwrap();
    assert!(
        three.is_some(),
        "a freed permit was not found past the deeper keys"
    );
    for permit in [two, three].into_iter().flatten() {
        permit.release().await.unwrap();
    }
    untouched(&mut raw, &foreign).await;
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

/// A user whose role may use `dlock/` only: locks work; a read-write lock
/// and a semaphore are refused with an error that names them and the
/// prefix the role lacks, with etcd's own message kept. A user with no
/// grant at all is refused at connect, told the three prefixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_the_key_and_the_missing_grant() {
    let server = EtcdServer::start();
    blocking(|| {
        for args in [
            &["user", "add", "root:root-pw"][..],
            &["role", "add", "locks"],
            &[
                "role",
                "grant-permission",
                "--prefix=true",
                "locks",
                "readwrite",
                "dlock/",
            ],
            &["user", "add", "app:app-pw"],
            &["user", "grant-role", "app", "locks"],
            &["user", "add", "nobody:nobody-pw"],
            &["auth", "enable"],
        ] {
            server.etcdctl(args);
        }
    });
    let url = format!("etcd://app:app-pw@{}", server.endpoint());
    let backend = connect(&url).await;
    let guard = lock(&backend, "jobs").acquire().await.unwrap();
    guard.release().await.unwrap();

    let err = dlock::RwLock::new("prices")
        .with_backend(backend.clone())
        .try_write()
        .await
        .unwrap_err();
    let shown = err.to_string();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    for part in [
        "read-write lock `prices`",
        "`dlock-rw/`",
        "permission denied",
    ] {
        assert!(shown.contains(part), "{part:?} not in: {shown}");
    }
    assert!(!shown.contains("app-pw"), "{shown}");

    let err = dlock::Semaphore::new("exports", 2)
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .unwrap_err();
    let shown = err.to_string();
    for part in [
        "semaphore `exports`",
        "`dlock-semaphores/`",
        "permission denied",
    ] {
        assert!(shown.contains(part), "{part:?} not in: {shown}");
    }

    let nobody = format!("etcd://nobody:nobody-pw@{}", server.endpoint());
    let err = EtcdBackend::connect(&nobody).await.unwrap_err();
    let shown = err.to_string();
    for part in [
        "`dlock/`",
        "`dlock-rw/`",
        "`dlock-semaphores/`",
        "permission denied",
    ] {
        assert!(shown.contains(part), "{part:?} not in: {shown}");
    }
    assert!(!shown.contains("nobody-pw"), "{shown}");
}
