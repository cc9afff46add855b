//! A guard dropped as `main` returns is released before the process exits,
//! with nothing for the program to call (issue 54): the README's hello
//! world, run 50 times in a row as a process of its own, each run followed
//! at once by a `try_acquire` of its key from this process.
//!
//! Before: 4 of 12 runs left the key held for its ttl (about 30 s), since
//! the release went to dlock's background thread and the process's exit
//! ended it first. See `lease/background/in_flight.rs`.

use std::time::Duration;

use dlock::Lock;
use dlock_tests::servers::redis::RedisServer;

const HELLO: &str = env!("CARGO_BIN_EXE_hello-main");
const RUNS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_as_main_returns_is_released() {
    let server = RedisServer::start();
    let other = dlock::connect(&server.url()).await.unwrap();
    let mut left_held = Vec::new();
    for run in 0..RUNS {
        let key = format!("hello-exit:{run}");
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(HELLO)
                .args([&server.url(), &key])
                .output(),
        )
        .await
        .expect("the hello world hung")
        .expect("run the hello world");
        assert!(
            out.status.success(),
            "run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("hello from the holder"));
        let taken = Lock::new(key.clone())
            .with_backend(other.clone())
            .try_acquire()
            .await
            .unwrap();
        match taken {
            Some(guard) => guard.release().await.unwrap(),
            None => left_held.push(key),
        }
    }
    eprintln!(
        "release at exit: {} of {RUNS} runs left their key held",
        left_held.len()
    );
    assert!(
        left_held.is_empty(),
        "{} of {RUNS} runs exited holding their key: {left_held:?}",
        left_held.len()
    );
}
