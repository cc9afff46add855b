//! A hand-off on Redis reaches one process: the turn is published on the
//! channel of the waiter's own backend (see `turns.rs` in dlock's source),
//! not on the key's channel that every waiting process hears; and a
//! process's queued waiters cost one heartbeat script per 300 ms between
//! them, not one each.
//!
//! What a waiting process receives is what the server delivers on the
//! channels it subscribes to: the key's release channel and its own turn
//! channel. An observer subscribed to `dlock:*` (a `redis-cli PSUBSCRIBE`
//! child) sees every message on both kinds, so it counts them per channel.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::LockError;
use dlock_tests::fixtures::redis::{
    lock_key, queue_backend as backend, queue_lock as lock, until_queued,
};
use dlock_tests::servers::redis::{RedisCluster, RedisServer};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Waiting processes of the hand-off tests.
const WAITERS: usize = 5;

/// The messages an observer saw, as (channel, payload).
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A `redis-cli PSUBSCRIBE dlock:*` on the server at `port`, and what it
/// has seen so far. The child is killed when dropped.
async fn observe(port: u16) -> (Child, Seen) {
    let mut child = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "PSUBSCRIBE",
            "dlock:*",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start redis-cli");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    // The confirmation: "psubscribe", the pattern, the count.
    let confirmed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line == "psubscribe" {
                let _ = lines.next_line().await;
                let _ = lines.next_line().await;
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(confirmed, Ok(true), "redis-cli subscribed within 10 s");
    let seen: Seen = Arc::default();
    let into = seen.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if line != "pmessage" {
                continue;
            }
            let _pattern = lines.next_line().await;
            let (Ok(Some(channel)), Ok(Some(payload))) =
                (lines.next_line().await, lines.next_line().await)
            else {
                return;
            };
            into.lock().unwrap().push((channel, payload));
        }
    });
    (child, seen)
}

/// A holder and [`WAITERS`] waiting processes queued behind it; the holder
/// releases and each waiter holds 20 ms in turn. Every turn message goes
/// to the channel of the process whose ticket it names, each waiting
/// process hears its own turn and nothing else (not the other waiters'
/// turns, nothing on the key's shared channel), and each is served once.
async fn one_process_per_hand_off(
    url: &str,
    cli: &dyn Fn(&[&str]) -> String,
    port: u16,
    what: &str,
) {
    let url = format!("{url}?foreign_share=0");
    let key = "turns-one";
    let (mut observer, seen) = observe(port).await;
    let holder = lock(key, backend(&url).await).acquire().await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let lock = lock(key, backend(&url).await);
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await
        }));
        until_queued(cli, key, i + 1).await;
    }
    holder.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("every waiter is served within 20 s")
            .unwrap()
            .unwrap();
    }
    // The last messages reach the observer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = observer.kill().await;
    let seen = seen.lock().unwrap().clone();
    println!("{what}: messages seen: {seen:#?}");
    let shared = format!("{}:released", lock_key(key));
    let on_shared: Vec<_> = seen.iter().filter(|(c, _)| *c == shared).collect();
    assert!(
        on_shared.is_empty(),
        "{what}: nothing on the key's shared channel, which every waiting process hears: {on_shared:?}"
    );
    let mut per_channel: HashMap<&str, usize> = HashMap::new();
    for (channel, payload) in &seen {
        let ticket = payload
            .strip_prefix("turn:")
            .unwrap_or_else(|| panic!("{what}: {payload:?} on {channel} is not a turn"));
        let named = ticket.split_once('@').map(|(_, c)| c);
        assert_eq!(
            named,
            Some(channel.as_str()),
            "{what}: the turn of {ticket} went to {channel}, not its process's channel"
        );
        *per_channel.entry(channel).or_default() += 1;
    }
    println!("{what}: turn messages per waiting process: {per_channel:?}");
    assert_eq!(
        per_channel.len(),
        WAITERS,
        "{what}: each of the {WAITERS} waiting processes heard its turn on a channel of its own"
    );
    // One turn per hand-off; a second one only if a heartbeat found the
    // key still free after the hand-off's 100 ms (a head slowed down).
    assert!(
        per_channel.values().all(|&n| n <= 2),
        "{what}: a process was woken more than twice: {per_channel:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_wakes_only_the_next_waiters_process() {
    let server = RedisServer::start();
    let cli = |args: &[&str]| server.redis_cli(args);
    one_process_per_hand_off(&server.url(), &cli, server.port(), "one server").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_wakes_only_the_next_waiters_process_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let cli = |args: &[&str]| cluster.redis_cli(args);
    // A PUBLISH reaches every node of a cluster: any node will do.
    let port = cluster.node(0).port();
    one_process_per_hand_off(&cluster.url(), &cli, port, "cluster").await;
}

/// One process with waiters on 20 held keys sends one heartbeat script per
/// 300 ms for all of them (before: one queued try per waiter per 300 ms,
/// 20 times as many); each waiting process subscribes to one turn channel
/// of its own, which only it hears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiters_of_one_process_share_one_heartbeat() {
    const KEYS: usize = 20;
    let server = RedisServer::start();
    let url = server.url();
    let holders_backend = backend(&url).await;
    let mut held = Vec::new();
    for i in 0..KEYS {
        held.push(
            lock(&format!("beat-{i}"), holders_backend.clone())
                .acquire()
                .await
                .unwrap(),
        );
    }
    let waiting = backend(&url).await;
    let mut waiters = Vec::new();
    for i in 0..KEYS {
        let lock = lock(&format!("beat-{i}"), waiting.clone()).wait(Duration::from_secs(8));
        waiters.push(tokio::spawn(async move { lock.acquire().await.map(drop) }));
    }
    let cli = |args: &[&str]| server.redis_cli(args);
    for i in 0..KEYS {
        until_queued(&cli, &format!("beat-{i}"), 1).await;
    }
    let channels = server.redis_cli(&["PUBSUB", "CHANNELS", "dlock:turns:*"]);
    let channels: Vec<&str> = channels.lines().collect();
    assert_eq!(
        channels.len(),
        1,
        "one waiting process, one turn channel: {channels:?}"
    );
    assert_eq!(
        server
            .redis_cli(&["PUBSUB", "NUMSUB", channels[0]])
            .lines()
            .nth(1),
        Some("1"),
        "only the waiting process hears its turn channel"
    );
    tokio::task::block_in_place(|| server.redis_cli(&["CONFIG", "RESETSTAT"]));
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let scripts = tokio::task::block_in_place(|| server.command_calls("evalsha"));
    println!("{KEYS} queued waiters of one process: {scripts} scripts in {window:?}");
    assert!(
        scripts <= 16,
        "{scripts} scripts in {window:?}: more than one heartbeat per 300 ms for all {KEYS} waiters (10)"
    );
    assert!(
        scripts >= 5,
        "{scripts} scripts in {window:?}: the heartbeat stopped"
    );
    for waiter in waiters {
        assert!(matches!(
            waiter.await.expect("the waiter task"),
            Err(LockError::Timeout { .. })
        ));
    }
    drop(held);
}
