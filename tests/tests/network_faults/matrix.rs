//! The fault matrix: each fault on every backend behind proxies.

use std::time::{Duration, Instant};

use dlock::{Election, Lock, MultiLock, RwLock, Semaphore};
use dlock_tests::proxy::FaultProxy;

use super::proxied::{
    etcd, postgres, redis, redis_cluster, redis_sentinel, redlock, zookeeper, Proxied,
};
use super::WAIT;

/// Which kinds of lease a backend's pause test asks for, beside a lock.
#[derive(Clone, Copy)]
struct Kinds {
    write_lock: bool,
    permit: bool,
    several_keys: bool,
    campaign: bool,
}

const ALL: Kinds = Kinds {
    write_lock: true,
    permit: true,
    several_keys: true,
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
/// has: a write lock, a permit, several keys, a campaign) are asked for with a 20 s
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
    if kinds.several_keys {
        let b = p.backend.clone();
        asks.spawn(async move {
            let keys = MultiLock::new(["paused-a", "paused-b", "paused-c"])
                .with_backend(b)
                .wait(WAIT);
            let granted = keys.acquire().await?;
            Ok(("several keys", Instant::now(), granted.is_held()))
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

/// `fault` on every proxy for 3 s while a free key is asked for with a
/// 20 s wait: granted once the network is back, and calls that do not wait
/// work right after. The faults: every byte both ways discarded
/// (connections kept open, so their streams are broken mid-message
/// afterwards), and every connection reset, new ones too.
async fn a_wait_rides_through(p: Proxied, what: &str, fault: fn(&FaultProxy)) {
    p.warm().await;
    p.each(fault);
    let started = Instant::now();
    let b = p.backend.clone();
    let asking = tokio::spawn(async move {
        let guard = Lock::new("through-a-fault")
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
            "{}: a wait failed across 3 s of {what} after {:?}: {e}",
            p.name,
            started.elapsed()
        )
    });
    eprintln!(
        "{}: {what} for 3 s: lock granted {:?} after the network was back",
        p.name,
        at.saturating_duration_since(back)
    );
    guard.release().await.expect("release after the fault");
    let lock = Lock::new("after-the-fault").with_backend(p.backend.clone());
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
                super::a_wait_rides_through($start.await, "bytes discarded", FaultProxy::blackhole)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_wait_rides_through_three_seconds_of_resets() {
                super::a_wait_rides_through($start.await, "connections reset", FaultProxy::reset)
                    .await;
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
// Redlock has locks only (one key or several).
fault_matrix!(
    on_redlock,
    redlock(),
    Kinds {
        write_lock: false,
        permit: false,
        several_keys: true,
        campaign: false,
    }
);
