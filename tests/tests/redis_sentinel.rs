//! Redis behind Sentinel (issue 24), against real servers: a master, its
//! replica and three sentinels started by the harness
//! (`dlock_tests::servers::sentinel`).
//!
//! - A holder survives a failover: its renewals follow the master to the
//!   promoted replica, and another client is never granted the key while the
//!   holder believes it holds it.
//! - The classic failure (the master grants, dies before its replica has
//!   the lease, the replica is promoted, a second client is granted the same
//!   key): shown with `replicas=0`, prevented by the default acknowledgement.
//! - Sentinel URL errors: no sentinel reachable, an unknown master, a wrong
//!   sentinel password, each a clear error within the connect timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::captured_log::CapturedLog;
use dlock_tests::failover::{hands_over, held_and_awaited, held_throughout};
use dlock_tests::fixtures::sentinel::{
    client_of_the_master, held_on_the_first_master, sentinel_client, HeldOnTheFirstMaster,
};
use dlock_tests::servers::sentinel::{RedisSentinel, SentinelOptions};

/// What dlock logs at INFO and above in this test binary (a global
/// subscriber: the failover event is emitted on dlock's own runtime).
fn logged() -> &'static CapturedLog {
    static LOGGED: std::sync::OnceLock<CapturedLog> = std::sync::OnceLock::new();
    LOGGED.get_or_init(|| {
        let log = CapturedLog::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(log.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        log
    })
}

fn with_param(url: &str, param: &str) -> String {
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}{param}")
}

/// Runs blocking harness work (waits for the sentinels) off the runtime's
/// worker.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(work)
}

/// A holds with a fencing token; the master is killed and the sentinels
/// promote the replica. A's guard stays held (its renewals reach the new
/// master) or reports lost before B is granted the key; B, waiting the
/// whole time, is never granted it while A holds; after A releases, B's
/// fence is greater than A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_survives_a_failover() {
    let logged = logged();
    let mut group = blocking(|| RedisSentinel::start(1));
    let url = group.url();
    let ttl = Duration::from_secs(6);
    let HeldOnTheFirstMaster {
        a,
        guard,
        first_master,
        waiting,
        ..
    } = held_on_the_first_master(&url, "sentinel:failover:holder", ttl).await;

    let lost = tokio::spawn(guard.lost());

    let old = group.master_addr();
    blocking(|| group.kill_master());
    let promoted = blocking(|| group.wait_failover(old, Duration::from_secs(30)))
        .expect("the sentinels promote the replica");
    // A's renewals must reach the new master: held over two ttls.
    held_throughout(&guard, &waiting, || true, ttl * 2).await;
    assert!(!lost.is_finished(), "A's lease was reported lost");
    assert_ne!(
        a.sentinel_master().unwrap(),
        first_master,
        "A still writes to the dead master"
    );
    let promoted_addr = group.node(promoted).addr().to_string();
    assert_eq!(a.sentinel_master().unwrap(), promoted_addr);
    // Operators see the switch: an INFO event naming the master and both nodes.
    let text = logged.text();
    // This failover's event: the binary's other tests fail over too.
    let event = text
        .lines()
        .find(|l| {
            l.contains("following the Redis master after a failover")
                && l.contains(&format!("from={first_master} "))
        })
        .unwrap_or_else(|| panic!("no failover event from {first_master} in:\n{text}"));
    for field in [
        "INFO",
        &format!("master={}", group.master_name()),
        &format!("from={first_master}"),
        &format!("to={promoted_addr}"),
    ] {
        assert!(event.contains(field), "{field} missing from: {event}");
    }

    let handed = hands_over(guard, waiting).await;
    println!(
        "failover: A kept its lease across the failover; B granted {handed:?} after A's release"
    );
}

/// The documented failover case. The replica is paused (SIGSTOP); with the
/// default `replicas=auto` the master's grant is not acknowledged and no
/// guard is handed over (`Replication`); with `replicas=0` the same acquire
/// succeeds, and once the master is killed and the paused replica (which
/// never got the key: a 32 MiB filler written first keeps the grant in the
/// master's own buffer) is resumed and promoted, B is granted the same key
/// while A still believes it holds it: the failure acknowledgement prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_grant_is_never_handed_over_and_without_acknowledgement_a_failover_gives_two_holders(
) {
    let mut group = blocking(|| RedisSentinel::start(1));
    let url = group.url();
    let acked = sentinel_client(&url).await;
    let unacked = sentinel_client(&with_param(&url, "replicas=0")).await;
    let key = "sentinel:classic";
    let ttl = Duration::from_secs(10);
    let replica = group.replica_indices()[0];
    blocking(|| group.pause(replica));

    // Acknowledgement asked for: refused, and nothing left on the master.
    let started = Instant::now();
    match Lock::new(key)
        .with_backend(acked.clone() as Arc<dyn LockBackend>)
        .ttl(ttl)
        .try_acquire()
        .await
    {
        Err(LockError::Replication {
            key: named,
            acknowledged,
            needed,
        }) => {
            assert_eq!(named, key);
            assert_eq!((acknowledged, needed), (0, 1));
        }
        other => panic!("expected a Replication error, got {other:?}"),
    }
    println!(
        "an unacknowledged grant refused after {:?}",
        started.elapsed()
    );
    assert_eq!(
        group.redis_cli_master(&["EXISTS", &format!("dlock:{{{key}}}")]),
        "0",
        "the unacknowledged grant was left on the master"
    );
    // A waiting acquire tries again within its wait, then says why.
    match Lock::new(key)
        .with_backend(acked.clone() as Arc<dyn LockBackend>)
        .ttl(ttl)
        .wait(Duration::from_millis(600))
        .acquire()
        .await
    {
        Err(LockError::Replication { .. }) => {}
        other => panic!("expected a Replication error after the wait, got {other:?}"),
    }

    // A paused replica still receives what the master sends until its
    // socket buffers are full (the kernel reads for it): 32 MiB of filler
    // fills them, so what the master writes next stays in the master's own
    // output buffer, and dies with it.
    group.redis_cli_master(&[
        "EVAL",
        "redis.call('SET', KEYS[1], string.rep('x', 33554432)) return 1",
        "1",
        "sentinel:filler",
    ]);
    // Without acknowledgement the grant is handed over...
    let a = Lock::new(key)
        .with_backend(unacked.clone() as Arc<dyn LockBackend>)
        .ttl(ttl)
        .acquire()
        .await
        .expect("with replicas=0 the acquire succeeds");
    // ...and lost with the master: the paused replica never got it.
    let old = group.master_addr();
    blocking(|| {
        group.kill_master();
        group.resume(replica);
    });
    blocking(|| group.wait_failover(old, Duration::from_secs(30)))
        .expect("the sentinels promote the replica");
    let b_backend = sentinel_client(&url).await;
    let b = tokio::time::timeout(
        Duration::from_secs(10),
        Lock::new(key)
            .with_backend(b_backend as Arc<dyn LockBackend>)
            .ttl(ttl)
            .wait(Duration::from_secs(5))
            .acquire(),
    )
    .await
    .expect("B's acquire hung")
    .expect("the promoted replica does not have A's key: B is granted it");
    assert!(
        a.is_held(),
        "A no longer believes it holds the key (the failure would not show)"
    );
    println!(
        "replicas=0: B granted the key while A still believed it held it (the classic failure)"
    );
    drop((a, b));
}

/// Wrong sentinel URLs fail with an error that names what failed, within
/// the connect timeout, and never show a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_url_errors_say_what_failed() {
    let group = blocking(|| {
        RedisSentinel::try_start_with(1, SentinelOptions::new().sentinel_password("S3ntinelPw"))
    })
    .expect("a sentinel group with a sentinel password");
    let hosts: Vec<String> = group
        .sentinel_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    let hosts = hosts.join(",");
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        addr
    };
    for (url, says) in [
        (
            format!("redis+sentinel://{closed}/mm?timeout_ms=2000&sentinel_password=x"),
            "no sentinel could be reached",
        ),
        (
            format!("redis+sentinel://{hosts}/nosuchmaster?timeout_ms=2000&sentinel_password=S3ntinelPw"),
            "no sentinel knows a master named `nosuchmaster`",
        ),
        (
            format!("redis+sentinel://{hosts}/{}?timeout_ms=2000&sentinel_password=Wr0ngPw", group.master_name()),
            "sentinel",
        ),
    ] {
        let started = Instant::now();
        let error = match RedisBackend::connect(&url).await {
            Ok(_) => panic!("{url}: connected"),
            Err(e) => e,
        };
        let took = started.elapsed();
        let text = error.to_string();
        assert!(
            matches!(error, LockError::Backend { .. }),
            "{url}: {error:?}"
        );
        assert!(text.contains(says), "{url}: `{text}` does not say `{says}`");
        assert!(
            !text.contains("S3ntinelPw") && !text.contains("Wr0ngPw"),
            "{url}: a password shows: {text}"
        );
        assert!(took < Duration::from_secs(5), "{url}: took {took:?}");
        println!("{}: {text} ({took:?})", dlock::url::redact(&url));
    }
    // The right password connects.
    let url = format!(
        "redis+sentinel://{hosts}/{}?sentinel_password=S3ntinelPw",
        group.master_name()
    );
    client_of_the_master(&group, &url).await;
}

/// A planned failover (`SENTINEL FAILOVER`, as in maintenance): the old
/// master is demoted in place and answers writes with `READONLY`, and the
/// sentinels announce `+switch-master`; either way the holder follows the
/// new master, keeps its lease, and the waiter is never granted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_follows_a_planned_failover() {
    let group = blocking(|| RedisSentinel::start(1));
    let url = group.url();
    let (a, b) = (sentinel_client(&url).await, sentinel_client(&url).await);
    let key = "sentinel:planned";
    let ttl = Duration::from_secs(6);
    let (guard, waiting) = held_and_awaited(a.clone(), b, key, ttl, "A acquires").await;
    let old = group.master_index();
    group.sentinel_cli(0, &["SENTINEL", "FAILOVER", group.master_name()]);
    let switched = || group.try_master_index().is_ok_and(|now| now != old);
    held_throughout(&guard, &waiting, switched, ttl * 2).await;
    assert_eq!(
        a.sentinel_master(),
        Some(group.master_addr().to_string()),
        "A does not write to the new master"
    );
    hands_over(guard, waiting).await;
}

/// A failover to a replica that may evict: the master has no `maxmemory`,
/// its replica `maxmemory 3mb` and `allkeys-lru` (a replica carries its own
/// settings). After `SENTINEL FAILOVER` the backend that connected to the
/// old master reads the new one, refuses its next acquire naming the new
/// master and `maxmemory-policy` (a grant is never handed over from it),
/// and tells the holder it had (an error logged, the loss alarm rung: the
/// lease, replicated to the new master, is kept). With `?eviction=accept`
/// acquires work on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_evicting_replica_is_refused() {
    let logged = logged();
    let group = blocking(|| RedisSentinel::start(1));
    let url = group.url();
    let replica = group.replica_indices()[0];
    let new_master = group.node(replica).addr().to_string();
    group
        .node(replica)
        .redis_cli(&["CONFIG", "SET", "maxmemory", "3mb"]);
    group
        .node(replica)
        .redis_cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let backend = sentinel_client(&url).await;
    let accepting = sentinel_client(&with_param(&url, "eviction=accept")).await;
    let lock = |key: &str| {
        Lock::new(key)
            .ttl(Duration::from_secs(6))
            .with_backend(backend.clone())
    };
    let held = lock("sentinel:evicting:held").acquire().await.unwrap();
    let old = group.master_addr();
    group.sentinel_cli(0, &["SENTINEL", "FAILOVER", group.master_name()]);
    let failover = Instant::now();
    // Bounded: 80 tries, 30 s. Before the backend follows the new master a
    // try may be granted by the old one (released at once) or fail with a
    // `Backend` error; once it writes to the new master, none is granted.
    let mut refusal = None;
    for _ in 0..80 {
        match lock("sentinel:evicting:next").try_acquire().await {
            Err(LockError::InvalidOption { reason }) => {
                refusal = Some(reason);
                break;
            }
            Ok(Some(guard)) => {
                let master = backend.sentinel_master();
                assert_ne!(
                    master.as_deref(),
                    Some(new_master.as_str()),
                    "granted on the evicting new master"
                );
                guard.release().await.unwrap();
            }
            Ok(None) => panic!("the lock is free"),
            Err(e) => println!("before the refusal: {e}"),
        }
        if failover.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let reason = refusal.expect("no acquire was refused within 30 s of the failover");
    println!(
        "refused {:?} after SENTINEL FAILOVER: {reason}",
        failover.elapsed()
    );
    assert_ne!(old.to_string(), new_master);
    for part in [
        "maxmemory-policy",
        "allkeys-lru",
        "eviction=accept",
        &new_master,
    ] {
        assert!(reason.contains(part), "{part} missing from: {reason}");
    }
    // The holder's backend told of it (logged once, the alarm rung).
    let told = Instant::now();
    while !logged.text().contains("may evict lock keys") {
        assert!(
            told.elapsed() < Duration::from_secs(10),
            "nothing logged about the evicting master: {}",
            logged.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let accepted = tokio::time::timeout(
        Duration::from_secs(20),
        Lock::new("sentinel:evicting:accepted")
            .ttl(Duration::from_secs(6))
            .with_backend(accepting.clone())
            .acquire(),
    )
    .await
    .expect("eviction=accept: acquired within 20 s")
    .expect("eviction=accept: acquired");
    assert_eq!(accepting.sentinel_master(), Some(new_master.clone()));
    accepted.release().await.unwrap();
    held.release().await.ok();
}
