//! The backends behind fault proxies: one Redis server, a Cluster whose
//! nodes announce their proxies, Sentinel watching the master through its
//! proxy, Redlock, PostgreSQL, etcd and ZooKeeper.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend};
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::servers::redis::{RedisCluster, RedisServer, RedisSet};
use dlock_tests::servers::sentinel::RedisSentinel;
use dlock_tests::servers::zookeeper::ZkServer;

use super::connect;

/// A backend whose every server is behind a fault proxy of its own.
pub(super) struct Proxied {
    pub(super) name: &'static str,
    proxies: Vec<FaultProxy>,
    pub(super) backend: Arc<dyn LockBackend>,
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

    pub(super) fn each(&self, fault: impl Fn(&FaultProxy)) {
        self.proxies.iter().for_each(fault);
    }

    /// A lock cycle, so that the backend's connections are open (and
    /// about to be frozen or held).
    pub(super) async fn warm(&self) {
        let guard = Lock::new("warm")
            .with_backend(self.backend.clone())
            .acquire()
            .await
            .expect("a lock before the fault");
        guard.release().await.expect("its release");
    }
}

pub(super) async fn redis() -> Proxied {
    let server = RedisServer::start();
    let addr = server.addr();
    Proxied::start("Redis", server, vec![addr], |h| format!("redis://{}", h[0])).await
}

pub(super) async fn redlock() -> Proxied {
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
pub(super) async fn redis_cluster() -> Proxied {
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
pub(super) async fn redis_sentinel() -> Proxied {
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

pub(super) async fn postgres() -> Proxied {
    let server = PgServer::start();
    let addr = server.addr();
    Proxied::start("PostgreSQL", server, vec![addr], |h| {
        format!("postgres://postgres@{}/postgres", h[0])
    })
    .await
}

pub(super) async fn etcd() -> Proxied {
    let server = EtcdServer::start();
    let addr = server.addr();
    Proxied::start("etcd", server, vec![addr], |h| format!("etcd://{}", h[0])).await
}

pub(super) async fn zookeeper() -> Proxied {
    let server = ZkServer::start();
    let addr = server.addr();
    Proxied::start("ZooKeeper", server, vec![addr], |h| {
        format!("zk://{}", h[0])
    })
    .await
}
