//! Replica acknowledgement on one master with a replica, checked on the
//! server (`INFO commandstats`): what `?replicas=` sends.
//!
//! - Concurrent grants share their `WAIT`s (one `WAIT` covers every write
//!   the connection sent before it): 64 tasks × 8 grants send far fewer
//!   `WAIT`s than grants, and every grant is on the replica when handed over.
//! - `replicas=0` sends neither `WAIT` nor `INFO`; `auto` on a master
//!   without replicas sends no `WAIT`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::acquisitions::acquire_and_release;
use dlock_tests::servers::{RedisOptions, RedisServer};

/// A master and a replica of it, the replica's link up.
fn master_and_replica() -> (RedisServer, RedisServer) {
    replicated(RedisOptions::new)
}

/// A master and a replica of it, both started with `options()`, once the
/// replica's link is up.
fn replicated(options: impl Fn() -> RedisOptions) -> (RedisServer, RedisServer) {
    let master = RedisServer::start_with(options());
    let replica = RedisServer::start_with(options().config([
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        master.port().to_string(),
    ]));
    let started = Instant::now();
    while !replica
        .redis_cli(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the replica did not link up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (master, replica)
}

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(RedisBackend::connect(url).await.expect("connect"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_grants_share_their_waits_and_are_on_the_replica() {
    const TASKS: usize = 64;
    const CYCLES: usize = 8;
    let (master, replica) = tokio::task::block_in_place(master_and_replica);
    let backend = connect(&master.url()).await;
    let before = master.command_calls("wait");
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let lock = Lock::new(format!("replicas:shared:{t}")).with_backend(backend.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..CYCLES {
                let guard = lock.acquire().await.expect("acknowledged");
                guard.release().await.expect("released");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task panicked");
    }
    let waits = master.command_calls("wait") - before;
    let grants = (TASKS * CYCLES) as u64;
    println!("{grants} grants sent {waits} WAITs");
    assert!(waits >= 1, "no WAIT was sent");
    assert!(
        waits <= grants / 2,
        "{waits} WAITs for {grants} grants: they were not shared"
    );
    // A grant handed over is on the replica: checked while held.
    let guard = Lock::new("replicas:on-the-replica")
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        replica.redis_cli(&["GET", "dlock:{replicas:on-the-replica}"]),
        guard.token(),
        "the replica does not have a grant that was handed over"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_zero_sends_nothing_and_auto_without_replicas_sends_no_wait() {
    let (master, _replica) = tokio::task::block_in_place(master_and_replica);
    let off = connect(&format!("{}?replicas=0", master.url())).await;
    // `INFO commandstats` counts itself once it ran: each reading adds one.
    let infos_before = master.command_calls("info");
    for i in 0..20 {
        acquire_and_release(&Lock::new(format!("replicas:off:{i}")).with_backend(off.clone()))
            .await;
    }
    let infos = master.command_calls("info") - infos_before;
    assert_eq!(
        infos, 1,
        "replicas=0 sent an INFO (only the test's own reading counts)"
    );
    assert_eq!(master.command_calls("wait"), 0, "replicas=0 sent a WAIT");

    let alone = RedisServer::start();
    let auto = connect(&alone.url()).await;
    let infos_before = alone.command_calls("info");
    for i in 0..20 {
        acquire_and_release(&Lock::new(format!("replicas:alone:{i}")).with_backend(auto.clone()))
            .await;
    }
    assert_eq!(
        alone.command_calls("wait"),
        0,
        "a master without replicas was sent a WAIT"
    );
    // The test's own reading excepted.
    let infos = alone.command_calls("info") - infos_before - 1;
    assert!(
        infos <= 3,
        "{infos} INFOs: the replica count is read once a second"
    );
}

/// A Valkey 8.1 master and replica, both with `appendonly yes` (`WAITAOF`
/// needs Redis 7.2 or Valkey; Debian's Redis 7.0 has none).
fn aof_master_and_replica() -> (RedisServer, RedisServer) {
    replicated(|| {
        RedisOptions::new()
            .valkey()
            .config(["--appendonly", "yes", "--appendfsync", "always"])
    })
}

/// `?aof=true`: grants wait for the master's own AOF fsync and the
/// replica's (`WAITAOF`); a paused replica's missing fsync refuses the
/// grant; a master without `appendonly` is a clear error, not a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aof_waits_for_the_fsync_of_master_and_replica() {
    use dlock::LockError;
    use dlock_tests::servers::ServerControl;

    let (master, mut replica) = tokio::task::block_in_place(aof_master_and_replica);
    let backend = connect(&format!("{}?aof=true", master.url())).await;
    for i in 0..10 {
        Lock::new(format!("replicas:aof:{i}"))
            .with_backend(backend.clone())
            .acquire()
            .await
            .expect("fsynced on both")
            .release()
            .await
            .unwrap();
    }
    let waitaofs = master.command_calls("waitaof");
    assert!(waitaofs >= 1, "no WAITAOF was sent");
    assert_eq!(master.command_calls("wait"), 0, "WAIT instead of WAITAOF");

    tokio::task::block_in_place(|| replica.pause());
    let refused = Lock::new("replicas:aof:paused")
        .with_backend(backend.clone())
        .ttl(Duration::from_secs(2))
        .try_acquire()
        .await;
    tokio::task::block_in_place(|| replica.resume());
    match refused {
        // The master's own fsync counts as one.
        Err(LockError::Replication {
            acknowledged,
            needed,
            ..
        }) => assert_eq!((acknowledged, needed), (1, 2)),
        other => panic!("expected a Replication error, got {other:?}"),
    }

    let plain = RedisServer::start_with(RedisOptions::new().valkey());
    let backend = connect(&format!("{}?aof=true&replicas=0", plain.url())).await;
    match Lock::new("replicas:aof:off")
        .with_backend(backend)
        .try_acquire()
        .await
    {
        Err(LockError::Backend { source, .. }) => assert!(
            source.to_string().contains("appendonly"),
            "the error does not say why: {source}"
        ),
        other => panic!("expected the server's refusal, got {other:?}"),
    }
}
