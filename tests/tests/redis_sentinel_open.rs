//! An open sentinel (no password: Redis's default) in front of a master
//! with a password: anyone who reaches the sentinel can point it at a node
//! of their own (`SENTINEL REMOVE` + `SENTINEL MONITOR`). dlock refuses
//! such a URL by default, so the fake master never receives the master's
//! password; `?sentinel_auth=none` accepts the risk (and the test shows the
//! risk is real: the fake master then receives `AUTH masterpw`); sentinels
//! with a password (`?sentinel_password=`) are the fix.

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::servers::sentinel::{RedisSentinel, SentinelOptions};

const MASTER_PASSWORD: &str = "masterpw";

/// A TCP listener that answers nothing and records every byte it receives,
/// until dropped (bounded: each read waits at most 200 ms).
struct FakeMaster {
    port: u16,
    received: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
}

impl FakeMaster {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake master");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (into, stopped) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut open = Vec::new();
            let started = Instant::now();
            while !stopped.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
                if let Ok((conn, _)) = listener.accept() {
                    conn.set_nonblocking(false).unwrap();
                    conn.set_read_timeout(Some(Duration::from_millis(50)))
                        .unwrap();
                    open.push(conn);
                }
                let mut buf = [0u8; 4096];
                for conn in &mut open {
                    if let Ok(n) = conn.read(&mut buf) {
                        into.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        FakeMaster {
            port,
            received,
            stop,
        }
    }

    fn got_password(&self) -> bool {
        let received = self.received.lock().unwrap();
        received
            .windows(MASTER_PASSWORD.len())
            .any(|w| w == MASTER_PASSWORD.as_bytes())
    }
}

impl Drop for FakeMaster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn hosts(group: &RedisSentinel) -> String {
    group
        .sentinel_addrs()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_sentinel_cannot_steer_the_master_password_to_a_fake_master() {
    let group = RedisSentinel::try_start_with(0, SentinelOptions::new().password(MASTER_PASSWORD))
        .expect("a sentinel group whose master has a password");
    let fake = FakeMaster::start();
    let port = fake.port.to_string();
    for i in 0..group.sentinels().len() {
        group.sentinel_cli(i, &["SENTINEL", "REMOVE", group.master_name()]);
        group.sentinel_cli(
            i,
            &[
                "SENTINEL",
                "MONITOR",
                group.master_name(),
                "127.0.0.1",
                &port,
                "2",
            ],
        );
    }
    let url = format!(
        "redis+sentinel://:{MASTER_PASSWORD}@{}/{}?timeout_ms=2000",
        hosts(&group),
        group.master_name()
    );

    // By default: refused before any connection, the password not shown.
    let refused = RedisBackend::connect(&url).await.unwrap_err();
    let text = refused.to_string();
    assert!(
        matches!(refused, LockError::InvalidOption { .. })
            && text.contains("sentinel_password")
            && text.contains("sentinel_auth=none")
            && !text.contains(MASTER_PASSWORD),
        "{text}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !fake.got_password(),
        "the fake master received the password"
    );

    // The risk is real: accepting open sentinels sends the password there.
    let accepted = format!("{url}&sentinel_auth=none");
    let _ = RedisBackend::connect(&accepted).await;
    let start = Instant::now();
    while !fake.got_password() && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fake.got_password(),
        "with sentinel_auth=none the steered connection carries AUTH {MASTER_PASSWORD}"
    );
}

/// The fix: sentinels with a password of their own, given to dlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_a_password_take_a_master_password() {
    let group = RedisSentinel::try_start_with(
        0,
        SentinelOptions::new()
            .password(MASTER_PASSWORD)
            .sentinel_password("sentinel-pw"),
    )
    .expect("a sentinel group with both passwords");
    let url = group.url_with_credentials();
    assert!(url.contains("sentinel_password="), "{url}");
    let backend: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(&url).await.unwrap());
    let guard = Lock::new("open-sentinels")
        .with_backend(backend)
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
}
