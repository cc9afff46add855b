//! A held lock's key lost on the server, against real redis-servers: a
//! server that may evict keys is refused at connect (unless the URL accepts
//! it) and again after a reconnect (a server restarted with an evicting
//! policy), a server without `INFO` needs `?replicas=N`, and a holder hears its key deleted, overwritten, expired early or
//! evicted through the keyspace notifications, at once rather than at its
//! next renewal; `ensure()` refuses from then on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockError, LockGuard};
use dlock_tests::fixtures::redis::lock_key;
use dlock_tests::servers::control::ServerControl;
use dlock_tests::servers::redis::{RedisOptions, RedisServer};

async fn connect(url: &str) -> Arc<RedisBackend> {
    Arc::new(
        RedisBackend::connect(url)
            .await
            .expect("connect to the test server"),
    )
}

fn server_with(words: &[&str]) -> RedisServer {
    RedisServer::start_with(RedisOptions::new().config(words.iter().copied()))
}

/// The holder's `lost()` as an instant, bounded by `limit`.
async fn lost_at(guard: &LockGuard, limit: Duration) -> Option<Instant> {
    let lost = guard.lost();
    tokio::time::timeout(limit, lost)
        .await
        .ok()
        .map(|()| Instant::now())
}

fn is_refused_for_loss(guard: &LockGuard) -> bool {
    !guard.is_held() && guard.ensure().is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_refused_unless_the_url_accepts_it() {
    for policy in ["allkeys-lru", "volatile-lru"] {
        let server = server_with(&["--maxmemory", "3mb", "--maxmemory-policy", policy]);
        let refused = RedisBackend::connect(&server.url()).await;
        let Err(LockError::InvalidOption { reason }) = refused else {
            panic!("{policy}: connect was not refused as an invalid option: {refused:?}");
        };
        println!("refusal ({policy}): {reason}");
        for part in ["maxmemory-policy", policy, "noeviction", "eviction=accept"] {
            assert!(reason.contains(part), "{part} missing from: {reason}");
        }
        let accepted = RedisBackend::connect(&format!("{}?eviction=accept", server.url())).await;
        assert!(
            accepted.is_ok(),
            "{policy} with eviction=accept: {accepted:?}"
        );
    }
    let safe = server_with(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]);
    RedisBackend::connect(&safe.url())
        .await
        .expect("noeviction with maxmemory set is safe");
    let bad = RedisBackend::connect(&format!("{}?eviction=maybe", safe.url())).await;
    let Err(LockError::InvalidOption { reason }) = bad else {
        panic!("eviction=maybe was not refused: {bad:?}");
    };
    assert!(reason.contains("eviction=maybe"), "{reason}");
}

/// A server restarted on the same address with `maxmemory 3mb` and
/// `maxmemory-policy allkeys-lru`: the backend connected before the restart
/// reads the server again after its connection broke, and its next acquire
/// is refused as at connect (never granted), naming `maxmemory-policy` and
/// the server. Once the server is set back to `noeviction`, acquires work
/// again through the same backend. On RESP2 (the default) and on RESP3, whose
/// connection reconnects on its own when it hears the server close it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_evicting_is_refused_at_the_next_acquire() {
    for protocol in ["", "?protocol=resp3"] {
        println!("protocol: {protocol:?}");
        restarted_evicting_is_refused(protocol).await;
    }
}

async fn restarted_evicting_is_refused(protocol: &str) {
    let mut server = RedisServer::start();
    let port = server.port();
    let backend = connect(&format!("{}{protocol}", server.url())).await;
    let lock = || {
        Lock::new("restarted-evicting")
            .ttl(Duration::from_secs(5))
            .with_backend(backend.clone())
    };
    let guard = lock().try_acquire().await.unwrap().expect("a free lock");
    guard.release().await.unwrap();
    tokio::task::block_in_place(|| server.stop());
    let evicting = tokio::task::block_in_place(|| {
        RedisServer::start_on(
            port,
            RedisOptions::new().config(["--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"]),
        )
    });
    let restarted = Instant::now();
    // Bounded: 40 tries, 10 s. A try may fail on the broken connection
    // first (a `Backend` error); none may be granted.
    let mut refusal = None;
    for _ in 0..40 {
        match lock().try_acquire().await {
            Err(LockError::InvalidOption { reason }) => {
                refusal = Some(reason);
                break;
            }
            Ok(granted) => panic!("an acquire on the evicting server answered {granted:?}"),
            Err(e) => println!("before the refusal: {e}"),
        }
        if restarted.elapsed() > Duration::from_secs(10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let reason = refusal.expect("no acquire was refused within 10 s of the restart");
    println!(
        "refused {:?} after the restart: {reason}",
        restarted.elapsed()
    );
    for part in [
        "maxmemory-policy",
        "allkeys-lru",
        "noeviction",
        "eviction=accept",
        &format!("127.0.0.1:{port}"),
    ] {
        assert!(reason.contains(part), "{part} missing from: {reason}");
    }
    // Refused again while it evicts: each try reads the server.
    assert!(matches!(
        lock().try_acquire().await,
        Err(LockError::InvalidOption { .. })
    ));
    evicting.redis_cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let guard = lock()
        .try_acquire()
        .await
        .expect("noeviction again: served")
        .expect("a free lock");
    guard.release().await.unwrap();
}

/// A server that renames `INFO` away cannot be checked for eviction: that
/// is accepted (a warning is logged once), not refused for what dlock
/// cannot read. But `?replicas=auto` (the default) counts the replicas
/// each grant waits for with `INFO replication`: without it, connect is
/// refused with the fix (`?replicas=N` or `?replicas=0`), rather than every
/// acquire failing; with `?replicas=0` the server serves locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_info_needs_a_replica_count() {
    let server = server_with(&[
        "--maxmemory",
        "3mb",
        "--maxmemory-policy",
        "allkeys-lru",
        "--rename-command",
        "INFO",
        "",
    ]);
    let refused = RedisBackend::connect(&server.url()).await;
    let Err(LockError::InvalidOption { reason }) = refused else {
        panic!("replicas=auto without INFO was not refused at connect: {refused:?}");
    };
    println!("refusal: {reason}");
    for part in [
        "INFO replication",
        "replicas=auto",
        "?replicas=N",
        "?replicas=0",
        &server.url(),
    ] {
        assert!(reason.contains(part), "{part} missing from: {reason}");
    }
    let backend = connect(&format!("{}?replicas=0", server.url())).await;
    let guard = Lock::new("no-info")
        .ttl(Duration::from_secs(5))
        .with_backend(backend)
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_key_is_heard_by_its_holder_at_once() {
    let server = server_with(&[
        "--maxmemory",
        "3mb",
        "--maxmemory-policy",
        "allkeys-lru",
        "--notify-keyspace-events",
        "KEA",
    ]);
    let backend = connect(&format!("{}?eviction=accept", server.url())).await;
    assert!(backend.keyspace_notifications());
    let guard = Lock::new("evicted")
        .ttl(Duration::from_secs(30))
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    // The holder's subscription goes out right after the grant.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let key = lock_key("evicted");
    // Each script writes 50 filler keys of 10 kB; the eviction runs at the
    // start of the next, which reports whether the lock key survived it.
    let fill = "local gone = redis.call('EXISTS', KEYS[1]) \
                for i = 1, 50 do redis.call('SET', 'filler:' .. ARGV[1] .. ':' .. i, string.rep('x', 10000)) end \
                return gone";
    let mut evicted_at = None;
    for batch in 0..400 {
        let exists = server.redis_cli(&["EVAL", fill, "1", &key, &batch.to_string()]);
        if exists == "0" {
            evicted_at = Some(Instant::now());
            break;
        }
    }
    let evicted_at = evicted_at.expect("the lock key was never evicted within 400 batches");
    let lost = lost_at(&guard, Duration::from_secs(5))
        .await
        .expect("lost() did not fire within 5 s of the eviction (ttl 30 s)");
    let took = lost.saturating_duration_since(evicted_at);
    println!("evicted key: lost() {took:?} after the eviction was seen");
    assert!(
        took < Duration::from_secs(2),
        "lost() {took:?} after the eviction"
    );
    assert!(is_refused_for_loss(&guard), "ensure() after the eviction");
}

/// How the key is taken from its holder behind its back.
#[derive(Clone, Copy, Debug)]
enum Loss {
    Del,
    Overwrite,
    ExpireEarly,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_overwritten_or_expired_key_is_heard_at_once() {
    let server = server_with(&["--notify-keyspace-events", "KEA"]);
    let holder = connect(&server.url()).await;
    let other = connect(&server.url()).await;
    assert!(holder.keyspace_notifications());
    let runs: [(Loss, usize); 3] = [
        (Loss::Del, 10),
        (Loss::Overwrite, 10),
        (Loss::ExpireEarly, 10),
    ];
    for (how, count) in runs {
        let mut figures = Vec::new();
        for run in 0..count {
            let name = format!("taken-{how:?}-{run}");
            let key = lock_key(&name);
            let guard = Lock::new(&name)
                .ttl(Duration::from_secs(30))
                .with_backend(holder.clone())
                .acquire()
                .await
                .unwrap();
            // The holder's subscription goes out right after the grant.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let lost = tokio::spawn({
                let lost = guard.lost();
                async move {
                    tokio::time::timeout(Duration::from_secs(15), lost)
                        .await
                        .ok()
                        .map(|()| Instant::now())
                }
            });
            let mut second = None;
            let sent = Instant::now();
            let from = match how {
                Loss::Del => {
                    server.redis_cli(&["DEL", &key]);
                    let granted = Lock::new(&name)
                        .ttl(Duration::from_secs(30))
                        .with_backend(other.clone())
                        .try_acquire()
                        .await
                        .unwrap()
                        .expect("the deleted key is granted to another client");
                    second = Some(granted);
                    Instant::now()
                }
                Loss::Overwrite => {
                    server.redis_cli(&["SET", &key, "someone-else"]);
                    Instant::now()
                }
                Loss::ExpireEarly => {
                    server.redis_cli(&["PEXPIRE", &key, "1"]);
                    Instant::now()
                }
            };
            let lost = lost.await.unwrap().unwrap_or_else(|| {
                panic!("{how:?} run {run}: lost() did not fire within 15 s (ttl 30 s)")
            });
            let took = lost.saturating_duration_since(from);
            // Signed, from the grant (or the write's return): negative when
            // lost() fired before redis-cli or the other grant came back.
            let signed_ms = |at: Instant| {
                if lost >= at {
                    lost.duration_since(at).as_secs_f64() * 1000.0
                } else {
                    -(at.duration_since(lost).as_secs_f64() * 1000.0)
                }
            };
            figures.push(format!(
                "{:.1}ms (sent +{:.1}ms)",
                signed_ms(from),
                signed_ms(sent)
            ));
            assert!(
                is_refused_for_loss(&guard),
                "{how:?} run {run}: ensure() Ok after lost()"
            );
            assert!(took < Duration::from_secs(1), "{how:?} run {run}: {took:?}");
            drop(guard);
            if let Some(second) = second {
                second.release().await.unwrap();
            }
        }
        println!("{how:?}: lost() after the other grant (Del) or the write, per run, and after the command was sent: {figures:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_with_notifications_costs_no_renewal_round() {
    let server = server_with(&["--notify-keyspace-events", "KEA"]);
    let backend = connect(&server.url()).await;
    let lock = Lock::new("cycles")
        .ttl(Duration::from_secs(30))
        .with_backend(backend.clone());
    let started = Instant::now();
    for _ in 0..300 {
        let guard = lock.acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    let renewals = backend.metrics().renew_round_trips;
    println!(
        "300 acquire/release cycles with holders listening: {:?}, {renewals} renewal round trips",
        started.elapsed()
    );
    assert!(renewals <= 3, "{renewals} renewal rounds for 300 cycles");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_redis_with_commands_renamed_and_an_idle_timeout_works() {
    let server = server_with(&[
        "--timeout",
        "5",
        "--rename-command",
        "CONFIG",
        "",
        "--rename-command",
        "CLIENT",
        "",
        "--rename-command",
        "DEBUG",
        "",
        "--rename-command",
        "KEYS",
        "",
        "--rename-command",
        "SCAN",
        "",
    ]);
    assert!(
        server
            .redis_cli(&["CONFIG", "GET", "timeout"])
            .contains("unknown command"),
        "CONFIG is renamed away"
    );
    let backend = connect(&server.url()).await;
    let waiter_backend = connect(&server.url()).await;
    // A holder whose connection the server closes while it is idle (ttl
    // 18 s: renewals 6 s apart, past the 5 s timeout) keeps its lock.
    let guard = Lock::new("managed")
        .ttl(Duration::from_secs(18))
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let waiter_backend = waiter_backend.clone();
        async move {
            let started = Instant::now();
            let guard = Lock::new("managed")
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(20))
                .with_backend(waiter_backend)
                .acquire()
                .await;
            (guard, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_secs(13)).await;
    assert!(
        guard.is_held(),
        "the holder lost its lock to the idle timeout"
    );
    guard
        .ensure()
        .expect("the holder's lock after 13 s across idle closes");
    guard.release().await.expect("release after idle closes");
    let (granted, waited) = waiter.await.unwrap();
    let granted = granted.expect("the 20 s wait behind the holder");
    println!("managed Redis: the waiter was granted after {waited:?} (holder released at ~13 s)");
    granted.release().await.unwrap();
    // An idle backend object (idle > 5 s: its connection closed by the
    // server) works again at once.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let started = Instant::now();
    let again = Lock::new("after-idle")
        .ttl(Duration::from_secs(5))
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .expect("an acquire after 7 s idle")
        .expect("the free key");
    let took = started.elapsed();
    println!("managed Redis: first acquire after 7 s idle took {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    again.release().await.unwrap();
}
