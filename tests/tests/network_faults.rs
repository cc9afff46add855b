//! Networks that fail quietly (issue 52), on real servers behind a fault
//! proxy, with one backend object kept for the whole test as an application
//! keeps it:
//!
//! - **flows frozen**: every open connection silently dead (a NAT or load
//!   balancer forgot the flows), new connections pass. The same backend
//!   object works again, without a new `connect`, and keeps working for
//!   calls that do not wait (so its connection was replaced, not waited
//!   out);
//! - **traffic held 8 s** while an acquisition with a 20 s wait is under
//!   way (a lock, a write lock, a permit, an election campaign): granted
//!   once the network is back, not failed at the first request timeout;
//! - **traffic held 1 s, then 3 s, then 10 s**: a lock waiting 20 s is
//!   granted after each; a free key tried without a wait is granted late or
//!   fails as an outage, never reported held;
//! - **a held lock through a 3 s pause** over its first renewal: still
//!   held, `lost()` never fired;
//! - **a server restart during a wait**: the waiter is served once the
//!   server is back, with no error.
//!
//! On one Redis server, a Cluster (each node announces its proxy's port),
//! Sentinel (the sentinels watch the master through its proxy), Redlock,
//! PostgreSQL, etcd and ZooKeeper. Each test prints how long the service
//! took to come back: the figures of the reliability guide's table.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Election, Lock, LockBackend, RwLock, Semaphore};
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::servers::redis::{RedisCluster, RedisServer, RedisSet};
use dlock_tests::servers::sentinel::RedisSentinel;
use dlock_tests::servers::zookeeper::ZkServer;

/// Far longer than any fault here: an acquisition that fails meanwhile
/// fails the test; one still waiting at the end fails it too.
const WAIT: Duration = Duration::from_secs(20);

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    dlock::connect(url)
        .await
        .expect("connect through the proxy")
}

/// A backend whose every server is behind a fault proxy of its own.
struct Proxied {
    name: &'static str,
    proxies: Vec<FaultProxy>,
    backend: Arc<dyn LockBackend>,
    /// The servers, stopped when the test ends.
    _servers: Box<dyn Any + Send>,
}

impl Proxied {
    /// `servers` behind a proxy each; the backend of the URL
    /// `url(proxy addresses)`.
    async fn start<S: Any + Send>(
        name: &'static str,
        servers: S,
        addrs: Vec<std::net::SocketAddr>,
        url: impl FnOnce(&[String]) -> String,
    ) -> Self {
        Self::start_prepared(name, servers, addrs, |_, _| {}, url).await
    }

    /// [`Proxied::start`], with `prepare` run once the proxies listen and
    /// before the backend connects: where the servers must name the proxies
    /// to their clients (a Cluster's slot map, the sentinels' master).
    async fn start_prepared<S: Any + Send>(
        name: &'static str,
        servers: S,
        addrs: Vec<std::net::SocketAddr>,
        prepare: impl FnOnce(&S, &[FaultProxy]),
        url: impl FnOnce(&[String]) -> String,
    ) -> Self {
        let mut proxies = Vec::new();
        for addr in addrs {
            proxies.push(FaultProxy::start(addr).await);
        }
        tokio::task::block_in_place(|| prepare(&servers, &proxies));
        let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
        let backend = connect(&url(&hosts)).await;
        Proxied {
            name,
            proxies,
            backend,
            _servers: Box::new(servers),
        }
    }

    fn each(&self, fault: impl Fn(&FaultProxy)) {
        self.proxies.iter().for_each(fault);
    }

    /// A lock cycle, so that the backend's connections are open (and
    /// about to be frozen or held).
    async fn warm(&self) {
        let guard = Lock::new("warm")
            .with_backend(self.backend.clone())
            .acquire()
            .await
            .expect("a lock before the fault");
        guard.release().await.expect("its release");
    }
}

async fn redis() -> Proxied {
    let server = RedisServer::start();
    let addr = server.addr();
    Proxied::start("Redis", server, vec![addr], |h| format!("redis://{}", h[0])).await
}

async fn redlock() -> Proxied {
    let set = RedisSet::start(3);
    let addrs = set.servers().iter().map(|s| s.addr()).collect();
    Proxied::start("Redlock", set, addrs, |h| {
        format!("redlock://{}", h.join(","))
    })
    .await
}

/// Three masters, each behind a proxy whose port it announces (its bus
/// port unchanged): the slot map and every redirect the client reads name
/// the proxies, so the faults reach every connection it opens.
async fn redis_cluster() -> Proxied {
    let cluster = RedisCluster::start(3);
    let addrs = cluster.nodes().iter().map(|n| n.addr()).collect();
    Proxied::start_prepared("Redis Cluster", cluster, addrs, announce_proxies, |h| {
        format!("redis+cluster://{}", h.join(","))
    })
    .await
}

/// Has each node announce its proxy's port, then waits until every node's
/// view of the cluster names the proxies only.
fn announce_proxies(cluster: &RedisCluster, proxies: &[FaultProxy]) {
    let wanted: BTreeSet<u16> = proxies.iter().map(|p| p.addr().port()).collect();
    for (node, proxy) in cluster.nodes().iter().zip(proxies) {
        let bus = (node.port() + 10_000).to_string();
        let port = proxy.addr().port().to_string();
        assert_eq!(
            node.redis_cli(&["CONFIG", "SET", "cluster-announce-bus-port", &bus]),
            "OK"
        );
        assert_eq!(
            node.redis_cli(&["CONFIG", "SET", "cluster-announce-port", &port]),
            "OK"
        );
    }
    let started = Instant::now();
    loop {
        let announced = cluster.nodes().iter().all(|node| {
            let table = node.redis_cli(&["CLUSTER", "NODES"]);
            let ports: BTreeSet<u16> = table
                .lines()
                .filter_map(|line| {
                    let addr = line.split_whitespace().nth(1)?.split('@').next()?;
                    addr.rsplit(':').next()?.parse().ok()
                })
                .collect();
            ports == wanted
        });
        if announced {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the cluster's nodes did not announce their proxies within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A master, a replica and three sentinels, the master and each sentinel
/// behind a proxy. The sentinels are told to watch the master through its
/// proxy (so they name the proxy to the client), and to wait a minute
/// before calling it down: the faults here are the client's network's,
/// not a failover.
async fn redis_sentinel() -> Proxied {
    let group = RedisSentinel::start(1);
    let mut addrs = vec![group.node(0).addr()];
    addrs.extend(group.sentinel_addrs());
    Proxied::start_prepared("Redis Sentinel", group, addrs, watch_through_proxy, |h| {
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", h[1..].join(","))
    })
    .await
}

const SENTINEL_MASTER: &str = "mm";

/// Points every sentinel at the master's proxy (`proxies[0]`), with a
/// minute's `down-after-milliseconds`, and waits until each names it.
fn watch_through_proxy(group: &RedisSentinel, proxies: &[FaultProxy]) {
    assert_eq!(group.master_name(), SENTINEL_MASTER);
    let port = proxies[0].addr().port().to_string();
    for i in 0..group.sentinels().len() {
        let cli = |args: &[&str]| group.sentinel_cli(i, args);
        assert_eq!(cli(&["SENTINEL", "REMOVE", SENTINEL_MASTER]), "OK");
        assert_eq!(
            cli(&[
                "SENTINEL",
                "MONITOR",
                SENTINEL_MASTER,
                "127.0.0.1",
                &port,
                "2"
            ]),
            "OK"
        );
        for (option, value) in [
            ("down-after-milliseconds", "60000"),
            ("failover-timeout", "120000"),
        ] {
            assert_eq!(
                cli(&["SENTINEL", "SET", SENTINEL_MASTER, option, value]),
                "OK"
            );
        }
    }
    let started = Instant::now();
    while group.master_addr() != proxies[0].addr() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the sentinels did not name the master's proxy within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn postgres() -> Proxied {
    let server = PgServer::start();
    let addr = server.addr();
    Proxied::start("PostgreSQL", server, vec![addr], |h| {
        format!("postgres://postgres@{}/postgres", h[0])
    })
    .await
}

async fn etcd() -> Proxied {
    let server = EtcdServer::start();
    let addr = server.addr();
    Proxied::start("etcd", server, vec![addr], |h| format!("etcd://{}", h[0])).await
}

async fn zookeeper() -> Proxied {
    let server = ZkServer::start();
    let addr = server.addr();
    Proxied::start("ZooKeeper", server, vec![addr], |h| {
        format!("zk://{}", h[0])
    })
    .await
}

/// Which kinds of lease a backend's pause test asks for, beside a lock.
#[derive(Clone, Copy)]
struct Kinds {
    write_lock: bool,
    permit: bool,
    campaign: bool,
}

const ALL: Kinds = Kinds {
    write_lock: true,
    permit: true,
    campaign: true,
};

/// Freezes every flow, then takes a free key with a wait: granted; then
/// calls that do not wait work at once, five times.
async fn frozen_flows_are_replaced(p: Proxied) {
    p.warm().await;
    p.each(FaultProxy::freeze_flows);
    let frozen = Instant::now();
    let lock = Lock::new("after-freeze").with_backend(p.backend.clone());
    let guard = lock
        .clone()
        .wait(WAIT)
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{}: no lock after the flows froze: {e}", p.name));
    eprintln!(
        "{}: flows frozen: first lock after {:?}",
        p.name,
        frozen.elapsed()
    );
    guard.release().await.expect("release after the freeze");
    for i in 0..5 {
        let guard = lock
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("{}: call {i} after recovery failed: {e}", p.name))
            .expect("the key is free");
        guard.release().await.expect("release after recovery");
    }
}

/// Holds all traffic for 8 s while a lock (and the `kinds` the backend
/// has: a write lock, a permit, a campaign) are asked for with a 20 s
/// wait: every one is granted once the traffic flows again.
async fn a_pause_shorter_than_the_wait_is_waited_out(p: Proxied, kinds: Kinds) {
    const PAUSE: Duration = Duration::from_secs(8);
    p.warm().await;
    p.each(FaultProxy::hold);
    let mut asks = tokio::task::JoinSet::new();
    let b = p.backend.clone();
    asks.spawn(async move {
        let lock = Lock::new("paused-lock").with_backend(b).wait(WAIT);
        let granted = lock.acquire().await?;
        Ok::<_, dlock::LockError>(("lock", Instant::now(), granted.is_held()))
    });
    if kinds.write_lock {
        let b = p.backend.clone();
        asks.spawn(async move {
            let rw = RwLock::new("paused-rw").with_backend(b).wait(WAIT);
            let granted = rw.write().await?;
            Ok(("write lock", Instant::now(), granted.is_held()))
        });
    }
    if kinds.permit {
        let b = p.backend.clone();
        asks.spawn(async move {
            let permits = Semaphore::new("paused-permits", 2)
                .with_backend(b)
                .wait(WAIT);
            let granted = permits.acquire().await?;
            Ok(("permit", Instant::now(), granted.is_held()))
        });
    }
    if kinds.campaign {
        let b = p.backend.clone();
        asks.spawn(async move {
            let election = Election::new("paused-election").with_backend(b).wait(WAIT);
            let granted = election.campaign("node-a").await?;
            Ok(("campaign", Instant::now(), granted.is_leader()))
        });
    }
    tokio::time::sleep(PAUSE).await;
    p.each(FaultProxy::pass);
    let back = Instant::now();
    while let Some(done) = asks.join_next().await {
        let (what, at, held) = done.expect("an acquisition panicked").unwrap_or_else(|e| {
            panic!(
                "{}: an acquisition failed during an {PAUSE:?} pause: {e}",
                p.name
            )
        });
        assert!(held, "{}: the {what} was not held when handed over", p.name);
        eprintln!(
            "{}: {PAUSE:?} pause: {what} granted {:?} after the traffic came back",
            p.name,
            at.saturating_duration_since(back)
        );
    }
}

/// Holds all traffic for 1 s, then 3 s, then 10 s. In each pause a lock
/// is asked for with a 20 s wait (granted once the traffic is back) and a
/// free key is tried without a wait: it is granted late or fails as an
/// outage (`Backend`, or `Quorum` on Redlock), never reported held by
/// someone.
async fn waits_ride_through_pauses_of_one_three_and_ten_seconds(p: Proxied) {
    p.warm().await;
    for secs in [1, 3, 10] {
        let pause = Duration::from_secs(secs);
        p.each(FaultProxy::hold);
        let held = Instant::now();
        let waiting = Lock::new(format!("pause-{secs}"))
            .with_backend(p.backend.clone())
            .wait(WAIT);
        let trying = Lock::new(format!("try-{secs}")).with_backend(p.backend.clone());
        let waited = tokio::spawn(async move {
            let guard = waiting.acquire().await;
            (guard, Instant::now())
        });
        let tried = tokio::spawn(async move {
            let outcome = trying.try_acquire().await;
            (outcome, held.elapsed())
        });
        tokio::time::sleep(pause).await;
        p.each(FaultProxy::pass);
        let back = Instant::now();
        let (guard, at) = waited.await.unwrap();
        let guard = guard.unwrap_or_else(|e| {
            panic!(
                "{}: a 20 s wait failed across a {pause:?} pause: {e}",
                p.name
            )
        });
        let (tried, after) = tried.await.unwrap();
        let outcome = match tried {
            Ok(Some(guard)) => {
                guard.release().await.expect("release the tried lock");
                "granted".to_string()
            }
            Ok(None) => panic!(
                "{}: a free key reported held after a {pause:?} pause",
                p.name
            ),
            // An outage: the server's (`Backend`), or too few Redlock masters
            // answering (`Quorum`).
            Err(e @ (dlock::LockError::Backend { .. } | dlock::LockError::Quorum { .. })) => {
                format!("{e}")
            }
            Err(e) => panic!("{}: a try in a {pause:?} pause ended as {e:?}", p.name),
        };
        eprintln!(
            "{}: {pause:?} pause: the waiting lock granted {:?} after the traffic came back; \
             a try without a wait: {outcome} after {after:?}",
            p.name,
            at.saturating_duration_since(back)
        );
        guard.release().await.expect("release after the pause");
    }
}

/// A lock with a 30 s ttl held through a 3 s pause over its first renewal
/// (a third of the ttl in): still held, `lost()` not fired.
async fn a_held_lock_rides_through_a_short_pause(p: Proxied) {
    let ttl = Duration::from_secs(30);
    let guard = Lock::new("held-through")
        .with_backend(p.backend.clone())
        .ttl(ttl)
        .acquire()
        .await
        .expect("the lock before the pause");
    tokio::time::sleep(ttl / 3 - Duration::from_millis(1500)).await;
    p.each(FaultProxy::hold);
    tokio::time::sleep(Duration::from_secs(3)).await;
    p.each(FaultProxy::pass);
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await;
    assert!(lost.is_err(), "{}: lost() fired after a 3 s pause", p.name);
    assert!(guard.is_held(), "{}: not held after a 3 s pause", p.name);
    guard.release().await.expect("release after the pause");
}

/// Every byte both ways discarded for 3 s (connections kept open, so their
/// streams are broken mid-message afterwards) while a free key is asked
/// for with a 20 s wait: granted once the network is back, and calls that
/// do not wait work right after.
async fn a_wait_rides_through_bytes_discarded(p: Proxied) {
    p.warm().await;
    p.each(FaultProxy::blackhole);
    let started = Instant::now();
    let b = p.backend.clone();
    let asking = tokio::spawn(async move {
        let guard = Lock::new("discarded")
            .with_backend(b)
            .wait(WAIT)
            .acquire()
            .await;
        guard.map(|guard| (guard, Instant::now()))
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    p.each(FaultProxy::pass);
    let back = Instant::now();
    let (guard, at) = asking.await.unwrap().unwrap_or_else(|e| {
        panic!(
            "{}: a wait failed across 3 s of discarded bytes after {:?}: {e}",
            p.name,
            started.elapsed()
        )
    });
    eprintln!(
        "{}: bytes discarded 3 s: lock granted {:?} after the network was back",
        p.name,
        at.saturating_duration_since(back)
    );
    guard.release().await.expect("release after the fault");
    let lock = Lock::new("after-discard").with_backend(p.backend.clone());
    for i in 0..5 {
        let guard = lock
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("{}: call {i} after the fault failed: {e}", p.name))
            .expect("the key is free");
        guard.release().await.expect("release after the fault");
    }
}

/// The fault matrix of one backend: `$start` builds it behind proxies,
/// `$kinds` says what its pause test asks for.
macro_rules! fault_matrix {
    ($backend:ident, $start:expr, $kinds:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn frozen_flows_are_replaced() {
                super::frozen_flows_are_replaced($start.await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn waits_ride_through_an_eight_second_pause() {
                super::a_pause_shorter_than_the_wait_is_waited_out($start.await, $kinds).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn waits_ride_through_pauses_of_one_three_and_ten_seconds() {
                super::waits_ride_through_pauses_of_one_three_and_ten_seconds($start.await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_wait_rides_through_three_seconds_of_discarded_bytes() {
                super::a_wait_rides_through_bytes_discarded($start.await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_held_lock_rides_through_a_three_second_pause() {
                super::a_held_lock_rides_through_a_short_pause($start.await).await;
            }
        }
    };
}

fault_matrix!(on_redis, redis(), ALL);
fault_matrix!(on_redis_cluster, redis_cluster(), ALL);
fault_matrix!(on_redis_sentinel, redis_sentinel(), ALL);
fault_matrix!(on_postgres, postgres(), ALL);
fault_matrix!(on_zookeeper, zookeeper(), ALL);
// The write lock too: a read-write queue entry whose create was cut off by
// the pause and landed late stood ahead of the retry's own entry for its
// session's life (2 of 3 runs not acquired within 20 s) until the retry
// asked under the same name (`etcd/rw.rs`).
fault_matrix!(on_etcd, etcd(), ALL);
// Redlock has locks only.
fault_matrix!(
    on_redlock,
    redlock(),
    Kinds {
        write_lock: false,
        permit: false,
        campaign: false,
    }
);

/// The waiter of a held key is served once the restarted server is back,
/// with no error. Where the holder's lease survives the restart (etcd keeps
/// leases, a ZooKeeper session outlives a short restart) the holder gives
/// it back once the server is back; where it does not (Redis without
/// persistence, PostgreSQL's sessions), `lost()` tells the old holder.
async fn a_waiter_is_served_after_a_restart<S>(
    name: &str,
    server: &mut S,
    url: &str,
    restart: impl FnOnce(&mut S),
    lease_survives: bool,
) {
    let holder = connect(url).await;
    let waiter = connect(url).await;
    let guard = Lock::new("restarted")
        .with_backend(holder)
        .acquire()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let lock = Lock::new("restarted").with_backend(waiter).wait(WAIT);
        let served = lock.acquire().await;
        served.map(|guard| (guard, Instant::now()))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| restart(server));
    let back = Instant::now();
    if lease_survives {
        let released = tokio::time::timeout(Duration::from_secs(10), guard.release()).await;
        eprintln!("{name}: restart: the holder's release after it: {released:?}");
    } else {
        tokio::time::timeout(Duration::from_secs(15), guard.lost())
            .await
            .unwrap_or_else(|_| panic!("{name}: the old holder was never told it lost the lease"));
    }
    let (served, at) = waiting
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{name}: the waiter failed across the restart: {e}"));
    eprintln!(
        "{name}: restart: waiter served {:?} after the server was back",
        at.saturating_duration_since(back)
    );
    served.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_waiter_is_served_after_a_restart() {
    let mut server = RedisServer::start();
    let url = server.url();
    a_waiter_is_served_after_a_restart("Redis", &mut server, &url, |s| s.restart(), false).await;
}

/// One master of a Redlock set restarted (without persistence) while a
/// waiter waits: the holder keeps its quorum on the other two and gives the
/// lease back once the master is back; the waiter is served. (Restarting
/// every master in turn forgets keys a lease granted between the restarts
/// may count on: a rehearsal saw the waiter's release find `NotHeld`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_a_waiter_is_served_after_a_restart() {
    let mut set = RedisSet::start(3);
    let url = set.url();
    let restart_one = |set: &mut RedisSet| set.servers_mut()[0].restart();
    a_waiter_is_served_after_a_restart("Redlock", &mut set, &url, restart_one, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiter_is_served_after_a_restart() {
    let mut server = PgServer::start();
    let url = server.url();
    a_waiter_is_served_after_a_restart("PostgreSQL", &mut server, &url, |s| s.restart(), false)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_waiter_is_served_after_a_restart() {
    let mut server = EtcdServer::start();
    let url = server.url();
    a_waiter_is_served_after_a_restart("etcd", &mut server, &url, |s| s.restart(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_a_waiter_is_served_after_a_restart() {
    let mut server = ZkServer::start();
    let url = server.url();
    a_waiter_is_served_after_a_restart("ZooKeeper", &mut server, &url, |s| s.restart(), true).await;
}

/// Twenty callers in flight on one connection whose answers arrive a second
/// late, in order: each is granted the key it asked for, with its own
/// token (its release, a compare-and-delete of that token, succeeds), and
/// the fences of one key never repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_callers_in_flight_on_a_late_connection_each_get_their_own_answer() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let backend = connect(&format!("redis://{}?timeout=10s", proxy.addr())).await;
    let guard = Lock::new("warm")
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    proxy.delay_replies(Duration::from_secs(1));
    let mut asks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let b = backend.clone();
        asks.spawn(async move {
            let key = format!("late:{i}");
            let guard = Lock::new(key.clone())
                .with_backend(b)
                .ttl(Duration::from_secs(30))
                .wait(WAIT)
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            (key, guard)
        });
    }
    let mut guards = Vec::new();
    while let Some(done) = asks.join_next().await {
        let (key, guard) = done.unwrap();
        assert_eq!(guard.key(), key, "a caller got another caller's lease");
        guards.push(guard);
    }
    proxy.pass();
    for guard in guards {
        let key = guard.key().to_owned();
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("{key}: the lease was not this caller's: {e}"));
    }
}

/// A wait that ends while the server has not answered at all is an outage
/// (`Backend`, 503 through `HttpError`), not contention (`Timeout`, 409):
/// `Timeout` means a holder was seen (issue 54). The server is stopped
/// (SIGSTOP; on PostgreSQL every process of it) before a free key is asked
/// for with a 1 s wait, shorter than the request timeout.
async fn a_wait_on_a_silent_server_ends_as_an_outage<S>(
    name: &str,
    server: &mut S,
    url: &str,
    pause: impl FnOnce(&mut S),
    resume: impl FnOnce(&mut S),
) {
    let backend = connect(url).await;
    let warm_up = Lock::new("warm")
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    warm_up.release().await.unwrap();
    pause(server);
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let ended = tokio::time::timeout(
        wait + Duration::from_secs(10),
        Lock::new("silent")
            .with_backend(backend)
            .wait(wait)
            .acquire(),
    )
    .await
    .unwrap_or_else(|_| panic!("{name}: the wait did not end"));
    resume(server);
    let err = ended.expect_err("acquired a lock on a stopped server");
    eprintln!(
        "{name}: stopped server, 1 s wait: {err} after {:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, dlock::LockError::Backend { .. }),
        "{name}: a wait on a silent server ended as {err:?}, not as an outage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_wait_on_a_silent_server_ends_as_an_outage() {
    let mut server = RedisServer::start();
    let url = server.url();
    a_wait_on_a_silent_server_ends_as_an_outage(
        "Redis",
        &mut server,
        &url,
        |s| s.pause(),
        |s| s.resume(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_wait_on_a_silent_server_ends_as_an_outage() {
    let mut server = PgServer::start();
    let url = server.url();
    // Every process of the server: each session has its own.
    a_wait_on_a_silent_server_ends_as_an_outage(
        "PostgreSQL",
        &mut server,
        &url,
        |s| s.try_pause_all().unwrap(),
        |s| s.try_resume_all().unwrap(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_wait_on_a_silent_server_ends_as_an_outage() {
    let mut server = EtcdServer::start();
    let url = server.url();
    a_wait_on_a_silent_server_ends_as_an_outage(
        "etcd",
        &mut server,
        &url,
        |s| s.pause(),
        |s| s.resume(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_a_wait_on_a_silent_server_ends_as_an_outage() {
    let mut server = ZkServer::start();
    let url = server.url();
    a_wait_on_a_silent_server_ends_as_an_outage(
        "ZooKeeper",
        &mut server,
        &url,
        |s| s.pause(),
        |s| s.resume(),
    )
    .await;
}

/// An acquisition given up while its enqueue is held in the network (its
/// wait ends while the connection it was sent on stalls for 8 s; new
/// connections pass, so the cleanup goes first) leaves nothing in line once
/// the enqueue lands late: the backend that sent it, still alive and
/// keeping its session, deletes the entry, so another client's wait for
/// the same lock is served, for a plain lock and a write lock on etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_an_enqueue_given_up_in_a_pause_leaves_no_entry_in_line() {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let proxied = connect(&format!("etcd://{}", proxy.addr())).await;
    let direct = connect(&server.url()).await;
    // Warm: the proxied backend's session and connection exist.
    let warm = Lock::new("warm").with_backend(proxied.clone());
    warm.acquire().await.unwrap().release().await.unwrap();
    proxy.hold_flows();
    let short = Duration::from_secs(2);
    let lock = Lock::new("late-lock")
        .with_backend(proxied.clone())
        .wait(short);
    let rw = RwLock::new("late-rw")
        .with_backend(proxied.clone())
        .wait(short);
    let (lock_ended, rw_ended) = tokio::join!(lock.acquire(), rw.write());
    assert!(lock_ended.is_err(), "a lock granted with every byte held");
    assert!(
        rw_ended.is_err(),
        "a write lock granted with every byte held"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    proxy.release_flows();
    let back = Instant::now();
    let lock = Lock::new("late-lock")
        .with_backend(direct.clone())
        .wait(WAIT);
    let rw = RwLock::new("late-rw")
        .with_backend(direct.clone())
        .wait(WAIT);
    let (lock_got, rw_got) = tokio::join!(
        async {
            let guard = lock.acquire().await;
            (guard, back.elapsed())
        },
        async {
            let guard = rw.write().await;
            (guard, back.elapsed())
        }
    );
    let (lock_guard, lock_after) = lock_got;
    let (rw_guard, rw_after) = rw_got;
    let lock_guard = lock_guard.expect("the lock stayed blocked by a late enqueue");
    let rw_guard = rw_guard.expect("the write lock stayed blocked by a late enqueue");
    eprintln!(
        "etcd: enqueues given up in an 8 s pause: another client's lock after {lock_after:?}, write lock after {rw_after:?}"
    );
    lock_guard.release().await.unwrap();
    rw_guard.release().await.unwrap();
    drop(proxied);
}
