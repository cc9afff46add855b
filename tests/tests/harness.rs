//! Tests of the test harness itself: every server kind starts, answers and is gone after
//! drop; restart, kill and pause work; the fault proxy passes, blackholes and resets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use dlock_tests::servers::ports::is_free;
use dlock_tests::servers::{RedisCluster, RedisOptions, RedisServer, RedisSet, ServerControl};

/// Sends `PING` over plain TCP and returns what came back (or the I/O error).
fn raw_ping(addr: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn redis_starts_answers_and_is_gone_after_drop() {
    let redis = RedisServer::start();
    assert!(redis.url().starts_with("redis://127.0.0.1:"));
    assert_eq!(redis.redis_cli(&["PING"]), "PONG");
    assert_eq!(redis.redis_cli(&["SET", "k", "v", "PX", "30000"]), "OK");
    let pttl: i64 = redis.redis_cli(&["PTTL", "k"]).parse().unwrap();
    assert!(pttl > 0 && pttl <= 30000, "PTTL {pttl}");
    let port = redis.port();
    drop(redis);
    assert!(is_free(port), "port {port} still in use after drop");
}

#[test]
fn redis_restart_on_same_port_and_kill9() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    let pid = redis.pid().unwrap();
    redis.kill9();
    assert!(redis.pid().is_none());
    assert!(raw_ping(redis.addr(), Duration::from_millis(300)).is_err());
    redis.start_again();
    assert_eq!(redis.port(), port);
    assert_ne!(redis.pid().unwrap(), pid);
    assert_eq!(redis.redis_cli(&["PING"]), "PONG");
    redis.restart();
    assert_eq!(
        raw_ping(redis.addr(), Duration::from_secs(2)).unwrap(),
        "+PONG\r\n"
    );
}

#[test]
fn redis_pause_and_resume() {
    let mut redis = RedisServer::start();
    redis.pause();
    let err = raw_ping(redis.addr(), Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    redis.resume();
    assert_eq!(
        raw_ping(redis.addr(), Duration::from_secs(2)).unwrap(),
        "+PONG\r\n"
    );
    // Dropping a paused server must not hang either.
    redis.pause();
    let port = redis.port();
    drop(redis);
    assert!(is_free(port));
}

#[test]
fn redis_acl_user_and_password() {
    let redis = RedisServer::start_with(
        RedisOptions::new()
            .password("pw")
            .acl_user("alice", "secret"),
    );
    assert_eq!(redis.redis_cli(&["ACL", "WHOAMI"]), "alice");
    assert!(redis.url_with_credentials().contains("alice:secret@"));
    let unauthenticated = raw_ping(redis.addr(), Duration::from_secs(2)).unwrap();
    assert!(unauthenticated.starts_with("-NOAUTH"), "{unauthenticated}");
}

#[test]
fn redis_tls_answers_with_ca() {
    let redis = RedisServer::start_tls();
    assert!(redis.url().starts_with("rediss://127.0.0.1:"));
    let ca = redis.ca_cert_path().unwrap();
    assert!(std::fs::read_to_string(ca)
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
    assert_eq!(redis.redis_cli(&["PING"]), "PONG");
    // Plain text on the TLS port gets no PONG.
    let plain = raw_ping(redis.addr(), Duration::from_millis(500));
    assert!(
        !matches!(plain, Ok(ref s) if s.contains("PONG")),
        "{plain:?}"
    );
}

#[test]
fn redis_set_of_independent_masters() {
    let set = RedisSet::start(3);
    assert_eq!(set.len(), 3);
    assert!(set.url().starts_with("redlock://127.0.0.1:"));
    assert_eq!(set.url().matches(',').count(), 2);
    set.server(0).redis_cli(&["SET", "only-here", "1"]);
    assert_eq!(set.server(1).redis_cli(&["EXISTS", "only-here"]), "0");
}

#[test]
fn redis_cluster_reaches_ok() {
    let cluster = RedisCluster::start(3);
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    assert_eq!(cluster.node_urls().len(), 3);
    assert!(cluster
        .node(1)
        .redis_cli(&["CLUSTER", "INFO"])
        .contains("cluster_state:ok"));
    for key in ["a", "b", "c", "dlock:{k}"] {
        assert_eq!(cluster.redis_cli(&["SET", key, "v"]), "OK");
        assert_eq!(cluster.redis_cli(&["GET", key]), "v");
    }
}

#[test]
fn missing_binary_names_the_install_command() {
    let err = dlock_tests::servers::process::require_binary(
        "no-such-server-binary-dlock",
        "redis-server redis-tools",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "no-such-server-binary-dlock not found: run `sudo apt-get install redis-server \
         redis-tools` or `scripts/install-deps.sh`"
    );
}

mod proxy {
    use std::net::SocketAddr;
    use std::time::Duration;

    use dlock_tests::proxy::{FaultProxy, ProxyMode};
    use dlock_tests::servers::RedisServer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::timeout;

    async fn ping(stream: &mut TcpStream) -> std::io::Result<String> {
        stream.write_all(b"PING\r\n").await?;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// A cut connection: the write or the read failed, or the read saw EOF.
    fn is_cut(result: &std::io::Result<String>) -> bool {
        result.as_ref().map_or(true, |s| s.is_empty())
    }

    async fn connect(addr: SocketAddr) -> TcpStream {
        TcpStream::connect(addr).await.unwrap()
    }

    #[tokio::test]
    async fn pass_blackhole_reset() {
        let redis = RedisServer::start();
        let proxy = FaultProxy::start(redis.addr()).await;
        assert_eq!(proxy.mode(), ProxyMode::Pass);

        let mut conn = connect(proxy.addr()).await;
        assert_eq!(ping(&mut conn).await.unwrap(), "+PONG\r\n");

        // Blackhole: the open connection and a new one both get silence.
        proxy.blackhole();
        let mut fresh = connect(proxy.addr()).await;
        for stream in [&mut conn, &mut fresh] {
            let silent = timeout(Duration::from_millis(300), ping(stream)).await;
            assert!(silent.is_err(), "expected a timeout, got {silent:?}");
        }

        // Back to pass: a new connection works.
        proxy.pass();
        let mut conn = connect(proxy.addr()).await;
        assert_eq!(ping(&mut conn).await.unwrap(), "+PONG\r\n");

        // Reset: the open connection is cut, and so is each new one.
        proxy.reset();
        let cut = timeout(Duration::from_secs(2), ping(&mut conn))
            .await
            .unwrap();
        assert!(is_cut(&cut), "{cut:?}");
        let mut refused = connect(proxy.addr()).await;
        let cut = timeout(Duration::from_secs(2), ping(&mut refused))
            .await
            .unwrap();
        assert!(is_cut(&cut), "{cut:?}");

        proxy.pass();
        let mut conn = connect(proxy.addr()).await;
        assert_eq!(ping(&mut conn).await.unwrap(), "+PONG\r\n");
        assert!(proxy.accepted() >= 5);

        // Dropping the proxy closes its port and its connections.
        let addr = proxy.addr();
        drop(proxy);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(addr).await.is_err());
        let closed = timeout(Duration::from_secs(2), ping(&mut conn))
            .await
            .unwrap();
        assert!(is_cut(&closed), "{closed:?}");
    }

    #[tokio::test]
    async fn drop_replies_lets_requests_through_and_answers_nothing() {
        let redis = RedisServer::start();
        let proxy = FaultProxy::start(redis.addr()).await;
        let mut conn = connect(proxy.addr()).await;
        proxy.drop_replies();
        conn.write_all(b"SET written-behind-the-proxy 1\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let silent = timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
        assert!(silent.is_err(), "expected no answer, got {silent:?}");
        assert_eq!(redis.redis_cli(&["GET", "written-behind-the-proxy"]), "1");
        proxy.pass();
        assert_eq!(ping(&mut conn).await.unwrap(), "+PONG\r\n");
    }

    #[tokio::test]
    async fn delay_replies_runs_requests_at_once_and_answers_late_in_order() {
        let redis = RedisServer::start();
        let proxy = FaultProxy::start(redis.addr()).await;
        let mut conn = connect(proxy.addr()).await;
        proxy.delay_replies(Duration::from_millis(400));
        let sent = std::time::Instant::now();
        conn.write_all(b"SET written-early 1\r\nPING\r\n")
            .await
            .unwrap();
        // The server ran it at once; the answer is still on its way.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(redis.redis_cli(&["GET", "written-early"]), "1");
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < b"+OK\r\n+PONG\r\n".len() {
            let n = timeout(Duration::from_secs(5), conn.read(&mut buf))
                .await
                .expect("the delayed answers never came")
                .unwrap();
            assert!(n > 0, "the connection closed");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"+OK\r\n+PONG\r\n", "answers out of order");
        let late = sent.elapsed();
        assert!(
            late >= Duration::from_millis(400),
            "answered after {late:?}"
        );
        // Back to pass: answers come at once again.
        proxy.pass();
        assert_eq!(ping(&mut conn).await.unwrap(), "+PONG\r\n");
    }

    #[tokio::test]
    async fn only_loopback_upstreams() {
        let err = FaultProxy::try_start("192.0.2.1:6379".parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}

mod etcd {
    use std::time::Duration;

    use dlock_tests::servers::ports::is_free;
    use dlock_tests::servers::{EtcdCluster, EtcdServer, ServerControl};

    #[test]
    fn single_member_starts_answers_restarts_and_stops() {
        let mut etcd = EtcdServer::start();
        assert_eq!(etcd.url(), format!("etcd://127.0.0.1:{}", etcd.port()));
        assert_eq!(etcd.etcdctl(&["put", "k", "v"]), "OK");
        assert_eq!(etcd.etcdctl(&["get", "k", "--print-value-only"]), "v");
        assert!(etcd.is_leader());
        // Data survives a crash and a restart on the same port.
        etcd.kill9();
        assert!(!etcd.is_healthy());
        etcd.start_again();
        assert_eq!(etcd.etcdctl(&["get", "k", "--print-value-only"]), "v");
        let (port, peer) = (etcd.port(), etcd.peer_port());
        drop(etcd);
        assert!(is_free(port) && is_free(peer));
    }

    #[test]
    fn tls_member_answers_with_ca() {
        let etcd = EtcdServer::start_tls();
        assert!(etcd.url().starts_with("etcds://127.0.0.1:"));
        assert!(etcd.ca_cert_path().is_some());
        assert_eq!(etcd.etcdctl(&["put", "k", "v"]), "OK");
        assert_eq!(etcd.etcdctl(&["get", "k", "--print-value-only"]), "v");
    }

    #[test]
    fn three_members_elect_a_new_leader_after_a_kill() {
        let mut cluster = EtcdCluster::start(3);
        assert_eq!(cluster.endpoints().len(), 3);
        assert_eq!(cluster.url().matches(',').count(), 2);
        let leader = cluster.wait_for_leader(Duration::from_secs(10)).unwrap();
        assert_eq!(cluster.etcdctl(&["put", "k", "v"]), "OK");
        cluster.member_mut(leader).kill9();
        let new_leader = cluster.wait_for_leader(Duration::from_secs(15)).unwrap();
        assert_ne!(new_leader, leader);
        cluster.member_mut(leader).start_again();
        assert_eq!(
            cluster
                .member(leader)
                .etcdctl(&["get", "k", "--print-value-only"]),
            "v"
        );
    }
}

mod zookeeper {
    use std::time::Duration;

    use dlock_tests::servers::ports::is_free;
    use dlock_tests::servers::{ServerControl, ZkEnsemble, ZkServer};

    #[test]
    fn standalone_starts_answers_pauses_restarts_and_stops() {
        let mut zk = ZkServer::start();
        assert_eq!(zk.url(), format!("zk://127.0.0.1:{}", zk.port()));
        assert_eq!(zk.mode().as_deref(), Some("standalone"));
        assert_eq!(zk.four_letter("ruok").unwrap(), "imok");
        let conf = zk.four_letter("conf").unwrap();
        assert!(conf.contains("tickTime=500"), "{conf}");
        assert!(conf.contains("minSessionTimeout=1000"), "{conf}");

        zk.pause();
        assert_eq!(zk.mode(), None);
        zk.resume();
        assert_eq!(zk.mode().as_deref(), Some("standalone"));

        zk.restart();
        assert_eq!(zk.mode().as_deref(), Some("standalone"));
        let port = zk.port();
        drop(zk);
        assert!(is_free(port));
    }

    #[test]
    fn ensemble_of_three_has_one_leader() {
        let mut zk = ZkEnsemble::start(3);
        assert_eq!(zk.url().matches(',').count(), 2);
        let leader = zk.wait_for_leader(Duration::from_secs(10)).unwrap();
        let followers = zk
            .nodes()
            .iter()
            .filter(|n| n.mode().as_deref() == Some("follower"))
            .count();
        assert_eq!(followers, 2);
        zk.node_mut(leader).kill9();
        let new_leader = zk.wait_for_leader(Duration::from_secs(20)).unwrap();
        assert_ne!(new_leader, leader);
    }
}

#[test]
fn redis_tls_cluster_reaches_ok() {
    let cluster = RedisCluster::try_start_with(3, RedisOptions::new().tls(true)).unwrap();
    assert_eq!(cluster.redis_cli(&["SET", "k", "v"]), "OK");
}

#[test]
fn redis_cluster_node_restart_rejoins() {
    let mut cluster = RedisCluster::start(3);
    cluster.node_mut(2).kill9();
    cluster.node_mut(2).start_again();
    cluster.wait_cluster_ok(Duration::from_secs(20)).unwrap();
    assert_eq!(cluster.redis_cli(&["SET", "after-restart", "v"]), "OK");
}
