//! 50,000 locks held by one backend object are each heard lost at once, at
//! the cost of one listener per backend, not one connection per lock
//! (issue 65's scale target): Redis holders listen to their keys' keyspace
//! channels on the backend's one subscription connection, etcd holders
//! watch their keys on one watch stream, ZooKeeper holders set a watch per
//! node on the backend's one session.
//!
//! Each test takes the 50,000 locks (500 at a time, as `held_50k.rs`), reads
//! the server's own count of the backend's connections, streams or watches,
//! takes one key away behind its holder's back (`DEL`, `etcdctl del`, an
//! operator's delete of the node), and checks that this guard's `lost()`
//! fires within [`HEARD_WITHIN`] while the 49,999 others stay held. The
//! figures are printed; the bound is generous (the machine is shared and
//! the build is a debug one).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{Lock, LockBackend, LockGuard};
use dlock_tests::fixtures::etcd::queue_prefix;
use dlock_tests::fixtures::redis::lock_key;
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::redis::{RedisOptions, RedisServer};
use dlock_tests::servers::zookeeper::ZkServer;
use tokio::task::JoinSet;

const HELD: usize = 50_000;
const IN_FLIGHT: usize = 500;
/// 30 s, not `held_50k.rs`'s 6 s: what is tested here is the listeners'
/// cost and a loss heard at once, not renewal capacity (that is
/// `held_50k.rs`'s). Renewals every 10 s leave the machine to the take and
/// the count. At 6 s, on this shared 2-core machine (load average 7-18 from
/// other builds), the debug build lost most leases while taking them in
/// some runs: ZooKeeper 0 in one run and nearly all in two others (49,447
/// counted; the take took 92-97 s); Redis with
/// keyspace events 40,672-48,966 in three runs (every renewal's `PEXPIRE`
/// is an event the holders' subscription reads: 50,000 per round), 0
/// without events.
const TTL: Duration = Duration::from_secs(30);
/// How long one acquisition may take (see `held_50k.rs`).
const WAIT: Duration = Duration::from_secs(30);
/// The bound on `lost()` after the key was taken away. The loss alarm makes
/// the watchdog renew every lease of the backend at once, here 50,000, and
/// that renewal reports the lost one: the figure is that round, printed.
/// Measured in this debug build on the shared 2-core machine: Redis 2.2-2.9 s
/// (its round the slowest: each key's `PEXPIRE` is also an event the
/// subscription reads), etcd 0.7 s, ZooKeeper 0.37-0.56 s, and 3.3 s at a load
/// average of 12. Generous, and still before the next scheduled renewal
/// of most leases (ttl/3 = 10 s).
const HEARD_WITHIN: Duration = Duration::from_secs(6);
/// Which of the held keys is taken away.
const VICTIM: usize = HELD / 2;

/// One at a time (as in `held_50k.rs`): two of these on 2 cores starve each
/// other's renewals. The test command runs this binary alone as well.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn key(i: usize) -> String {
    format!("held-50k-loss:{i:05}")
}

/// Runs blocking harness work (CLIs, 4-letter words) off the runtime.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(work)
}

/// Takes the [`HELD`] locks on `backend`, at most [`IN_FLIGHT`] at a time.
async fn take_all(backend: Arc<dyn LockBackend>, ttl: Duration) -> Vec<LockGuard> {
    let started = Instant::now();
    let mut guards: Vec<Option<LockGuard>> = (0..HELD).map(|_| None).collect();
    let mut taking = JoinSet::new();
    let mut next = 0;
    let mut taken = 0;
    while taken < HELD {
        while next < HELD && taking.len() < IN_FLIGHT {
            let lock = Lock::new(key(next))
                .with_backend(backend.clone())
                .ttl(ttl)
                .wait(WAIT);
            let i = next;
            taking.spawn(async move { (i, lock.acquire().await) });
            next += 1;
        }
        let (i, guard) = taking.join_next().await.unwrap().unwrap();
        guards[i] = Some(guard.unwrap_or_else(|e| panic!("acquire {}: {e}", key(i))));
        taken += 1;
    }
    eprintln!("{HELD} locks taken in {:?}", started.elapsed());
    guards.into_iter().map(Option::unwrap).collect()
}

/// Takes the victim's key away with `remove` (blocking: a CLI or an
/// operator's client), then checks its `lost()` fires within
/// `bound` of the removal's return, `ensure()` refuses, and every
/// other guard is still held. The time is printed from the removal's
/// return (0 when `lost()` came first) and from when it was sent.
async fn take_one_away(
    guards: &[LockGuard],
    backend: &str,
    bound: Duration,
    remove: impl Future<Output = ()>,
) {
    let victim = &guards[VICTIM];
    let lost = victim.lost();
    let heard = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });
    let sent = Instant::now();
    remove.await;
    let removed = Instant::now();
    let heard_at = tokio::time::timeout(Duration::from_secs(15), heard)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{backend}: lost() of {} did not fire within 15 s (ttl {TTL:?})",
                key(VICTIM)
            )
        })
        .expect("the task waiting on lost()");
    let after_removed = heard_at.saturating_duration_since(removed);
    eprintln!(
        "{backend}: one of {HELD} held keys taken away: lost() {:.1} ms after the removal returned ({:.1} ms after it was sent)",
        after_removed.as_secs_f64() * 1000.0,
        heard_at.saturating_duration_since(sent).as_secs_f64() * 1000.0,
    );
    assert!(
        victim.ensure().is_err(),
        "{backend}: ensure() refuses once lost"
    );
    assert!(
        after_removed < bound,
        "{backend}: lost() {after_removed:?} after the removal (bound {bound:?})"
    );
    let lost: Vec<usize> = (0..HELD)
        .filter(|&i| i != VICTIM && !guards[i].is_held())
        .collect();
    assert!(
        lost.is_empty(),
        "{backend}: {} other leases lost with the victim's (first: {:?})",
        lost.len(),
        lost.first().map(|&i| key(i))
    );
}

/// Releases every guard still held, at most [`IN_FLIGHT`] at a time. A
/// lease lost while the 50,000 releases queue (the machine is shared) is
/// counted and printed, not failed: what is tested was checked before.
async fn release_all(guards: Vec<LockGuard>, backend: &str) {
    let mut releasing: JoinSet<Result<(), dlock::LockError>> = JoinSet::new();
    let mut lost = 0;
    let mut count = |released: Result<(), dlock::LockError>| match released {
        Ok(()) => {}
        Err(dlock::LockError::NotHeld { .. }) => lost += 1,
        Err(e) => panic!("{backend}: release: {e}"),
    };
    for guard in guards.into_iter().filter(LockGuard::is_held) {
        if releasing.len() >= IN_FLIGHT {
            count(releasing.join_next().await.unwrap().unwrap());
        }
        releasing.spawn(async move { guard.release().await });
    }
    while let Some(released) = releasing.join_next().await {
        count(released.unwrap());
    }
    eprintln!("{backend}: released; {lost} leases found lost at their release");
}

/// One connection of Redis's `CLIENT LIST`: its name-value fields.
fn client_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_redis_holders_listen_on_one_subscription() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let server =
        RedisServer::start_with(RedisOptions::new().config(["--notify-keyspace-events", "KEA"]));
    let holder = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    assert!(holder.keyspace_notifications());
    let guards = take_all(holder.clone(), TTL).await;
    // The channels are subscribed without awaiting the answer: let the last
    // `SUBSCRIBE`s land (bounded), counting them on the server.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (commands, subscribers) = loop {
        let list = blocking(|| server.redis_cli(&["CLIENT", "LIST"]));
        // redis-cli's own connection is the one running `client|list`.
        let ours: Vec<&str> = list
            .lines()
            .filter(|l| !l.is_empty() && client_field(l, "cmd") != Some("client|list"))
            .collect();
        let (subscribers, commands): (Vec<&str>, Vec<&str>) = ours
            .iter()
            .partition(|l| client_field(l, "sub").is_some_and(|n| n != "0"));
        let subscribed: usize = subscribers
            .iter()
            .filter_map(|l| client_field(l, "sub")?.parse::<usize>().ok())
            .sum();
        if subscribed >= HELD || Instant::now() > deadline {
            eprintln!(
                "redis: {HELD} held locks ({} not held): {} command connections, {} subscription connection(s) with {subscribed} channels",
                guards.iter().filter(|g| !g.is_held()).count(),
                commands.len(),
                subscribers.len()
            );
            for line in &ours {
                eprintln!(
                    "  CLIENT LIST: id={} sub={} cmd={}",
                    client_field(line, "id").unwrap_or("?"),
                    client_field(line, "sub").unwrap_or("?"),
                    client_field(line, "cmd").unwrap_or("?"),
                );
            }
            assert!(subscribed >= HELD, "a channel per held key: {subscribed}");
            break (commands.len(), subscribers.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        subscribers, 1,
        "one subscription connection for {HELD} holders"
    );
    assert!(
        (1..=8).contains(&commands),
        "a few command connections, not one per lock: {commands}"
    );
    let victim_key = lock_key(&key(VICTIM));
    take_one_away(&guards, "redis DEL", HEARD_WITHIN, async {
        let deleted = blocking(|| server.redis_cli(&["DEL", &victim_key]));
        assert_eq!(deleted, "1", "DEL {victim_key}");
    })
    .await;
    release_all(guards, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_etcd_holders_watch_on_one_stream() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = EtcdServer::start();
    let streams_before = blocking(|| server.mvcc_gauge("watch_stream_total"));
    let watchers_before = blocking(|| server.mvcc_gauge("watcher_total"));
    // A request limit of 20 s, not 5 s: on the shared 2-core machine (load
    // average 18 measured beside this test) one enqueue among the 50,000
    // went unanswered for 5 s, which fails the take, not what is tested.
    let url = format!("{}?timeout=20s", server.url());
    let holder: Arc<dyn LockBackend> = dlock::connect(&url).await.unwrap();
    let guards = take_all(holder.clone(), TTL).await;
    // The watchers are created without awaiting the answer: let them reach
    // the server (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut watchers = 0.0;
    while Instant::now() < deadline {
        watchers = blocking(|| server.mvcc_gauge("watcher_total")) - watchers_before;
        if watchers >= HELD as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let streams = blocking(|| server.mvcc_gauge("watch_stream_total")) - streams_before;
    eprintln!(
        "etcd: {HELD} held locks ({} not held): {streams} watch streams, {watchers} watchers on the server",
        guards.iter().filter(|g| !g.is_held()).count()
    );
    assert!(
        watchers >= HELD as f64,
        "a watcher per held key: {watchers}"
    );
    // The held keys' watchers on one stream; past 128 keys a renewal keeps
    // a second, the namespace's deletes (`deletions.rs`).
    assert!(
        streams <= 2.0,
        "one or two streams, not one per key: {streams}"
    );
    let listed = blocking(|| {
        server.etcdctl(&[
            "get",
            "--prefix",
            "--keys-only",
            &queue_prefix(&key(VICTIM)),
        ])
    });
    let entries: Vec<&str> = listed.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        entries.len(),
        1,
        "one entry for {}: {entries:?}",
        key(VICTIM)
    );
    take_one_away(&guards, "etcd del", HEARD_WITHIN, async {
        blocking(|| server.etcdctl(&["del", entries[0]]));
    })
    .await;
    release_all(guards, "etcd").await;
}

/// The `name\tvalue` line `name` of ZooKeeper's `mntr`.
fn mntr(server: &ZkServer, name: &str) -> u64 {
    let answer = blocking(|| server.four_letter("mntr")).expect("mntr");
    answer
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in mntr: {answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_zookeeper_holders_watch_on_one_session() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = ZkServer::start();
    // The 4-letter word's own connection is counted in both readings.
    let connections_before = mntr(&server, "zk_num_alive_connections");
    let holder = Arc::new(ZooKeeperBackend::connect(&server.url()).await.unwrap());
    let guards = take_all(holder.clone(), TTL).await;
    // Each watch is set 50 ms after its grant (`node_watch.rs`): let the
    // last land (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut watches = 0;
    while Instant::now() < deadline {
        watches = mntr(&server, "zk_watch_count");
        if watches >= HELD as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let connections = mntr(&server, "zk_num_alive_connections") - connections_before;
    let wchs = blocking(|| server.four_letter("wchs")).expect("wchs");
    let cons = blocking(|| server.four_letter("cons")).expect("cons");
    eprintln!(
        "zookeeper: {HELD} held locks ({} not held): {connections} connection(s) of the backend, {watches} watches; wchs: {}",
        guards.iter().filter(|g| !g.is_held()).count(),
        wchs.trim().replace('\n', "; ")
    );
    for line in cons.lines().filter(|l| !l.trim().is_empty()) {
        eprintln!("  cons: {}", line.trim());
    }
    assert_eq!(connections, 1, "one session for {HELD} holders");
    assert!(watches >= HELD as u64, "a watch per held node: {watches}");
    // An operator's session, opened after the count.
    let operator = ZooKeeperBackend::connect(&server.url()).await.unwrap();
    let admin = operator.client().expect("the operator's session");
    let dir = holder.lock_path(&key(VICTIM)).expect("a valid key");
    let children = admin
        .list_children(&dir)
        .await
        .expect("list the victim's node");
    assert_eq!(children.len(), 1, "one node under {dir}: {children:?}");
    let node = format!("{dir}/{}", children[0]);
    take_one_away(&guards, "zookeeper delete", HEARD_WITHIN, async {
        admin
            .delete(&node, None)
            .await
            .expect("the operator deletes the node");
    })
    .await;
    release_all(guards, "zookeeper").await;
}
