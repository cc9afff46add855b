//! A server restarted while a waiter waits on a held key.

use std::time::{Duration, Instant};

use dlock::Lock;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::servers::redis::{RedisCluster, RedisServer, RedisSet};
use dlock_tests::servers::zookeeper::ZkServer;

use super::{connect, WAIT};

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

/// The Cluster node that serves the held key is killed and started again
/// (without persistence, its cluster configuration kept): the holder's
/// lease is gone with the node's data, `lost()` tells it, and the waiter is
/// served once the node is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_waiter_is_served_after_a_node_restart() {
    let mut cluster = RedisCluster::start(3);
    let url = cluster.url();
    let restart_the_keys_node = |cluster: &mut RedisCluster| {
        // dlock's key of "restarted" is `dlock:{restarted}`: its slot is
        // the hash tag's.
        let slot: u16 = cluster
            .redis_cli(&["CLUSTER", "KEYSLOT", "restarted"])
            .parse()
            .expect("a slot number");
        let (node, _) = cluster.shard_of(slot).expect("the slot's master");
        cluster.node_mut(node).kill9();
        cluster.node_mut(node).start_again();
        cluster
            .wait_cluster_ok(Duration::from_secs(20))
            .expect("the cluster back after the restart");
    };
    a_waiter_is_served_after_a_restart(
        "Redis Cluster",
        &mut cluster,
        &url,
        restart_the_keys_node,
        false,
    )
    .await;
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
