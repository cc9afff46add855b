//! A held key removed behind the holder's back (`etcdctl lease revoke` of
//! its session, `etcdctl del` of the key) is heard at once: the holder's
//! `lost()` fires no later than about when another client is granted the
//! lock, and `ensure()` refuses from then on (issue 65). The watchers of
//! held keys ride one watch stream per backend, whatever their number.

use std::time::{Duration, Instant};

use dlock_tests::loss_heard::{lost_relative_to_next_grant, report_worst, watch_lost};

use super::*;

/// How many removals of each kind.
const RUNS: usize = 10;

/// How a run takes the holder's key away.
#[derive(Clone, Copy, Debug)]
enum Removal {
    RevokeLease,
    DeleteKey,
}

/// The holder's key of `key` (its one queue entry), as etcdctl lists it.
fn held_entry(server: &EtcdServer, key: &str) -> String {
    let listed = server.etcdctl(&["get", "--prefix", "--keys-only", &queue_prefix(key)]);
    let entries: Vec<&str> = listed.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(entries.len(), 1, "one key under {key}: {entries:?}");
    entries[0].to_owned()
}

/// One run: A holds `key` (ttl 30 s), the key goes by `removal`, B acquires.
/// Returns when A heard the loss, relative to B's grant (negative: before).
async fn one_run(
    server: &EtcdServer,
    a: &Arc<dyn LockBackend>,
    b: &Arc<dyn LockBackend>,
    key: &str,
    removal: Removal,
) -> f64 {
    let guard = lock(a, key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .expect("A acquires");
    let heard = watch_lost(&guard);
    let entry = held_entry(server, key);
    blocking(|| match removal {
        Removal::DeleteKey => {
            server.etcdctl(&["del", &entry]);
        }
        Removal::RevokeLease => {
            let lease = entry.rsplit('/').next().expect("a lease id in the key");
            server.etcdctl(&["lease", "revoke", lease]);
        }
    });
    let next = async {
        lock(b, key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .expect("B acquires once A's key is gone")
    };
    lost_relative_to_next_grant(guard, heard, next, &format!("{removal:?}")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_key_is_heard_lost_by_the_time_another_client_gets_it() {
    let server = EtcdServer::start();
    let a = connect(&server.url()).await;
    let b = connect(&server.url()).await;
    for removal in [Removal::RevokeLease, Removal::DeleteKey] {
        let mut figures = Vec::with_capacity(RUNS);
        for run in 0..RUNS {
            let key = format!("heard-{removal:?}-{run}");
            let ms = one_run(&server, &a, &b, &key, removal).await;
            eprintln!("etcd {removal:?} run {run}: holder's lost() {ms:+.1} ms after the other client's grant");
            figures.push(ms);
        }
        report_worst(&format!("etcd {removal:?}"), &figures);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_held_keys_are_watched_on_one_stream() {
    const HELD: usize = 3_000;
    let server = EtcdServer::start();
    let a = connect(&server.url()).await;
    let streams_before = blocking(|| server.mvcc_gauge("watch_stream_total"));
    let mut guards = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let guard = lock(&a, &format!("many-{i}"))
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .expect("acquire");
        guards.push(guard);
    }
    // Let the watchers reach the server (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut watchers = 0.0;
    while Instant::now() < deadline {
        watchers = blocking(|| server.mvcc_gauge("watcher_total"));
        if watchers >= HELD as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let streams = blocking(|| server.mvcc_gauge("watch_stream_total")) - streams_before;
    eprintln!("etcd: {HELD} held keys: {streams} watch streams, {watchers} watchers on the server");
    assert!(
        watchers >= HELD as f64,
        "a watcher per held key: {watchers}"
    );
    // One stream for the held keys' watchers; renewals of 128 keys and
    // more may keep a second, the namespace's deletes (`deletions.rs`).
    assert!(
        streams <= 2.0,
        "streams stay one or two, not one per key: {streams}"
    );
    // A key removed among the thousands is still heard at once.
    let victim = guards.pop().expect("a guard");
    let lost = victim.lost();
    let entry = held_entry(&server, &format!("many-{}", HELD - 1));
    let removed = Instant::now();
    blocking(|| server.etcdctl(&["del", &entry]));
    tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("the loss of one key among thousands is heard");
    eprintln!(
        "etcd: one of {HELD} held keys deleted: lost() {:.1} ms after etcdctl del started",
        removed.elapsed().as_secs_f64() * 1000.0
    );
    assert!(victim.ensure().is_err(), "ensure() refuses once lost");
    for guard in guards {
        guard.release().await.expect("release");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left = f64::MAX;
    while Instant::now() < deadline {
        left = blocking(|| server.mvcc_gauge("watcher_total"));
        if left < 10.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("etcd: after releasing them: {left} watchers left on the server");
    assert!(
        left < 10.0,
        "released keys' watchers are cancelled: {left} left"
    );
}

/// The watch stream breaks with the member's restart; it is opened again
/// and each held key watched again from its create revision, so a delete
/// made right after the restart, before the new stream is there, is still
/// heard, by about when another client gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_right_after_a_restart_is_heard_through_the_new_stream() {
    let mut server = EtcdServer::start();
    let a = connect(&server.url()).await;
    let b = connect(&server.url()).await;
    let guard = lock(&a, "restarted")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .expect("A acquires");
    let heard = watch_lost(&guard);
    let entry = held_entry(&server, "restarted");
    blocking(|| {
        server.restart();
        server.etcdctl(&["del", &entry]);
    });
    let deleted = Instant::now();
    let other = lock(&b, "restarted")
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("B acquires once A's key is gone");
    let granted = Instant::now();
    let heard_at = tokio::time::timeout(Duration::from_secs(15), heard)
        .await
        .expect("A hears the loss after the restart")
        .expect("the waiting task");
    let after_grant = heard_at.saturating_duration_since(granted);
    eprintln!(
        "etcd restart then del: lost() {:.1} ms after the delete, {:.1} ms after the other grant (0: before it)",
        heard_at.saturating_duration_since(deleted).as_secs_f64() * 1000.0,
        after_grant.as_secs_f64() * 1000.0
    );
    assert!(guard.ensure().is_err(), "ensure() refuses once lost");
    assert!(
        after_grant < Duration::from_secs(2),
        "lost() {after_grant:?} after the other grant"
    );
    other.release().await.expect("B releases");
}
