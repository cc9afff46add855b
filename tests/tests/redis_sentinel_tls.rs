//! Redis behind Sentinel over TLS (`rediss+sentinel://`), against real
//! servers: a TLS-only master, its replica and three TLS-only sentinels, all
//! trusting one throwaway CA (`SentinelOptions::tls`).
//!
//! - dlock finds the master through the sentinels over TLS, connects to it
//!   over TLS, and acquires and releases a lock with a fencing token.
//! - A wrong CA, and a plain-text `redis+sentinel://` URL to the TLS-only
//!   sentinels, are each a `LockError::Backend` within a few seconds.
//! - A holder survives a failover over TLS (the promoted replica is reached
//!   over TLS too).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::failover::held_throughout;
use dlock_tests::fixtures::sentinel::{
    client_of_the_master, held_on_the_first_master, HeldOnTheFirstMaster,
};
use dlock_tests::servers::sentinel::{RedisSentinel, SentinelOptions};
use dlock_tests::tls::TestCerts;

/// Bound for a connection attempt that must fail: dlock's own connect
/// timeout is 5 s; a hang shows up as this timeout instead.
const FAIL_WITHIN: Duration = Duration::from_secs(10);

/// Starts a TLS group with `replicas` replicas, off the runtime's worker.
fn start_tls(replicas: usize) -> RedisSentinel {
    tokio::task::block_in_place(|| {
        RedisSentinel::try_start_with(replicas, SentinelOptions::new().tls(true))
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// Connects to `url`, which must fail with [`LockError::Backend`] within
/// [`FAIL_WITHIN`]; returns the error's text and how long it took.
async fn refused(url: &str) -> (String, Duration) {
    let started = Instant::now();
    let result = tokio::time::timeout(FAIL_WITHIN, RedisBackend::connect(url))
        .await
        .unwrap_or_else(|_| panic!("connecting to {url} hung for {FAIL_WITHIN:?}"));
    let took = started.elapsed();
    match result {
        Ok(_) => panic!("connected to {url}"),
        Err(e @ LockError::Backend { .. }) => (e.to_string(), took),
        Err(e) => panic!("connecting to {url}: expected a backend error, got {e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_through_tls_sentinels() {
    let group = start_tls(1);
    let url = group.url();
    assert!(url.starts_with("rediss+sentinel://127.0.0.1:"), "{url}");
    let ca = group.ca_cert_path().expect("a TLS group has a CA");
    assert!(url.ends_with(&format!("/mm?ca={}", ca.display())), "{url}");
    // The harness itself talks TLS to the sentinels and the nodes.
    assert_eq!(group.sentinel_cli(0, &["PING"]), "PONG");
    assert_eq!(group.redis_cli_master(&["PING"]), "PONG");

    let started = Instant::now();
    let backend = client_of_the_master(&group, &url).await;
    eprintln!("connected over TLS in {:?}", started.elapsed());
    let lock = Lock::new("sentinel:tls:basic")
        .with_backend(backend.clone() as Arc<dyn LockBackend>)
        .ttl(Duration::from_secs(5));
    let guard = lock.acquire().await.expect("acquire over TLS");
    let first = guard.fencing_token().expect("a fencing token");
    assert!(guard.is_held());
    guard.release().await.expect("release over TLS");
    let guard = lock.acquire().await.expect("acquire again");
    let second = guard.fencing_token().expect("a fencing token");
    assert!(second > first, "fencing tokens grow: {first} then {second}");
    guard.release().await.expect("release again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_or_plain_text_fails_cleanly() {
    let group = start_tls(1);
    let url = group.url();
    let ca = group
        .ca_cert_path()
        .expect("a TLS group has a CA")
        .display()
        .to_string();

    // A CA that signed nothing here.
    let other = tempfile::tempdir().unwrap();
    let wrong = TestCerts::generate(other.path()).unwrap();
    let wrong_url = url.replace(&ca, &wrong.ca_cert_path().display().to_string());
    assert_ne!(wrong_url, url);
    let (error, took) = refused(&wrong_url).await;
    eprintln!("wrong CA refused in {took:?}: {error}");
    assert!(error.contains("certificate"), "{error}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // Plain text to the TLS-only sentinels.
    let plain = url
        .replacen("rediss+sentinel://", "redis+sentinel://", 1)
        .split('?')
        .next()
        .unwrap()
        .to_string();
    let (error, took) = refused(&plain).await;
    eprintln!("plain text refused in {took:?}: {error}");
    assert!(error.contains("no sentinel could be reached"), "{error}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // The group is still fine for a client with the right CA.
    client_of_the_master(&group, &url).await;
}

/// As `redis_sentinel.rs::a_holder_survives_a_failover`, over TLS: A holds,
/// the master is killed with SIGKILL, the sentinels promote the replica;
/// A's lease is still held two ttls later (its renewals reached the new
/// master over TLS) and B, waiting meanwhile, is never granted the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_survives_a_failover_over_tls() {
    let mut group = start_tls(1);
    let url = group.url();
    let ttl = Duration::from_secs(6);
    let HeldOnTheFirstMaster {
        a,
        guard,
        fence: fence_a,
        first_master,
        waiting,
    } = held_on_the_first_master(&url, "sentinel:tls:failover", ttl).await;

    let old = group.master_addr();
    let started = Instant::now();
    tokio::task::block_in_place(|| group.kill_master());
    let promoted =
        tokio::task::block_in_place(|| group.wait_failover(old, Duration::from_secs(30)))
            .expect("the sentinels promote the replica");
    eprintln!("failover over TLS took {:?}", started.elapsed());
    held_throughout(&guard, &waiting, || true, ttl * 2).await;
    let promoted_addr = group.node(promoted).addr().to_string();
    assert_ne!(promoted_addr, first_master);
    assert_eq!(a.sentinel_master(), Some(promoted_addr));

    guard.release().await.expect("A releases on the new master");
    let (_, guard_b) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("B is granted the key after A's release")
        .unwrap();
    let guard_b = guard_b.expect("B acquires");
    let fence_b = guard_b.fencing_token().expect("a fencing token");
    assert!(fence_b > fence_a, "B's fence {fence_b} after A's {fence_a}");
    guard_b.release().await.unwrap();
}
