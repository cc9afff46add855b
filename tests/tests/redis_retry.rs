//! An acquire that runs twice with one token (a client that resends a
//! request whose answer it lost) is acquired both times, with the same
//! fence: on one server, in a batch, on Redis Cluster and on Redlock. And
//! the resend for real: the cluster client resends a script after its
//! connection broke between the write and the answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Lease};
use dlock::backends::redis::RedisBackend;
use dlock::backends::redlock::RedlockBackend;
use dlock::LockBackend;
use dlock_tests::proxy::FaultProxy;
use dlock_tests::servers::redis::{RedisCluster, RedisServer, RedisSet};

fn request(key: &str, token: &str) -> AcquireRequest {
    AcquireRequest {
        key: key.to_owned(),
        token: token.to_owned(),
        ttl: Duration::from_secs(30),
    }
}

/// Runs `req` twice on `backend` (`try_acquire`, then `acquire`): both are
/// acquired with the same fence. Returns the lease.
async fn twice(backend: &dyn LockBackend, req: &AcquireRequest) -> Lease {
    let first = backend
        .try_acquire(req)
        .await
        .expect("first run")
        .expect("first run acquired a free key");
    let again = backend
        .try_acquire(req)
        .await
        .expect("second run")
        .unwrap_or_else(|| panic!("the same acquire run again was refused: {req:?}"));
    assert_eq!(again.fencing_token, first.fencing_token);
    let waited = backend
        .acquire(req, Some(Instant::now() + Duration::from_secs(2)))
        .await
        .expect("third run")
        .unwrap_or_else(|| panic!("the same acquire waited out: {req:?}"));
    assert_eq!(waited.fencing_token, first.fencing_token);
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_run_twice_on_one_server_is_acquired_twice() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lease = twice(&backend, &request("twice", "token-twice")).await;
    // The second run counted the ttl again; the key is still the lease's.
    assert_eq!(server.redis_cli(&["GET", "dlock:{twice}"]), "token-twice");
    let pttl: u64 = server
        .redis_cli(&["PTTL", "dlock:{twice}"])
        .parse()
        .unwrap();
    assert!(pttl > 25_000, "PTTL {pttl}");
    assert!(backend.release(&lease).await.unwrap());
    // Other tokens contend as before: the next one takes it, a third is refused.
    let other = backend.try_acquire(&request("twice", "token-other")).await;
    assert!(matches!(other, Ok(Some(_))), "{other:?}");
    let held = backend.try_acquire(&request("twice", "token-third")).await;
    assert!(matches!(held, Ok(None)), "{held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_run_many_times_at_once_is_acquired_in_a_batch() {
    const RUNS: usize = 24;
    let server = RedisServer::start();
    let backend = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let req = request("batched-twice", "token-batched");
    // Many runs in flight at once: past the few that go out alone, they
    // queue and go out together in one batched script call.
    let runs: Vec<_> = (0..RUNS)
        .map(|_| {
            let (backend, req) = (backend.clone(), req.clone());
            tokio::spawn(async move { backend.try_acquire(&req).await })
        })
        .collect();
    let mut fences = Vec::new();
    for run in runs {
        let lease = run
            .await
            .unwrap()
            .expect("no error")
            .expect("every run of the same acquire is acquired");
        fences.push(lease.fencing_token);
    }
    assert!(backend.metrics().batches > 0, "no batch formed");
    assert!(
        fences.iter().all(|f| *f == fences[0]),
        "one acquisition, several fences: {fences:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_run_twice_on_a_cluster_is_acquired_twice() {
    let cluster = RedisCluster::start(3);
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    let lease = twice(&backend, &request("cluster-twice", "token-c")).await;
    assert!(backend.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_run_twice_on_redlock_is_acquired_twice() {
    let set = RedisSet::start(3);
    let backend = RedlockBackend::connect(&set.url()).await.unwrap();
    let lease = twice(&backend, &request("redlock-twice", "token-r")).await;
    assert!(backend.release(&lease).await.unwrap());
    for server in set.servers() {
        assert_eq!(server.redis_cli(&["EXISTS", "dlock:{redlock-twice}"]), "0");
    }
}

/// A key (`retry:<i>`) whose slot `node` serves.
fn key_served_by(node: &RedisServer) -> String {
    let nodes = node.redis_cli(&["CLUSTER", "NODES"]);
    let mine = nodes
        .lines()
        .find(|l| l.contains("myself"))
        .expect("a myself line");
    let ranges: Vec<(u16, u16)> = mine
        .split_whitespace()
        .skip(8)
        .filter_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    (0..1000)
        .map(|i| format!("retry:{i}"))
        .find(|key| {
            let slot: u16 = node
                .redis_cli(&["CLUSTER", "KEYSLOT", &format!("dlock:{{{key}}}")])
                .parse()
                .unwrap();
            ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot))
        })
        .expect("a key in the node's slots")
}

/// Waits (bounded) until `check` holds.
async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The retry for real: the cluster client writes the acquire script, the
/// answer is lost, the connection breaks, and the client resends the
/// script on a new connection. The resent script finds the key holding
/// the caller's own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_acquire_resent_after_its_answer_was_lost_is_acquired() {
    let cluster = RedisCluster::start(3);
    let node = cluster.node(0);
    let proxy = FaultProxy::start(node.addr()).await;
    // Node 0 tells the cluster, and so the client, to reach it through the
    // proxy (its bus port stays the real one).
    let proxy_port = proxy.addr().port().to_string();
    let bus_port = (node.port() + 10_000).to_string();
    node.redis_cli(&["CONFIG", "SET", "cluster-announce-bus-port", &bus_port]);
    node.redis_cli(&["CONFIG", "SET", "cluster-announce-port", &proxy_port]);
    for other in cluster.nodes() {
        eventually(
            "every node announces node 0 behind the proxy",
            Duration::from_secs(20),
            || other.redis_cli(&["CLUSTER", "SLOTS"]).contains(&proxy_port),
        )
        .await;
    }
    let key = key_served_by(node);
    let lock_key = format!("dlock:{{{key}}}");
    let backend = Arc::new(
        RedisBackend::connect(&format!(
            "redis+cluster://{}?timeout_ms=10000",
            proxy.addr()
        ))
        .await
        .unwrap(),
    );
    // Load the script on node 0 first, so the lost answer is the script's
    // own and not a NOSCRIPT.
    let warm = backend
        .try_acquire(&request(&key, "token-warm"))
        .await
        .unwrap()
        .expect("free key");
    assert!(backend.release(&warm).await.unwrap());
    let accepted = proxy.accepted();

    proxy.drop_replies();
    let req = request(&key, "token-resent");
    let attempt = {
        let (backend, req) = (backend.clone(), req.clone());
        tokio::spawn(async move { backend.try_acquire(&req).await })
    };
    eventually(
        "the script ran on the server",
        Duration::from_secs(5),
        || node.redis_cli(&["GET", &lock_key]) == "token-resent",
    )
    .await;
    // Break the connection; the client reconnects and sends the script again.
    proxy.reset();
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.pass();
    let answer = tokio::time::timeout(Duration::from_secs(20), attempt)
        .await
        .expect("the acquire ended")
        .unwrap();
    assert!(
        proxy.accepted() > accepted,
        "the client never reconnected, so nothing was resent"
    );
    let lease = answer
        .expect("the resent acquire answered")
        .expect("the resent acquire found its own token and must count as acquired");
    let fence: u64 = node
        .redis_cli(&["GET", &format!("{lock_key}:fence")])
        .parse()
        .unwrap();
    assert_eq!(lease.fencing_token, Some(fence));
    assert!(backend.release(&lease).await.unwrap());
}
