//! The built `dlock` binary against real servers the harness starts.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::redis::RedisServer;
use dlock_tests::servers::zookeeper::ZkServer;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(url: &str, args: &[&str]) -> Output {
    Command::new(DLOCK)
        .env("DLOCK_URL", url)
        .args(args)
        .output()
        .expect("run dlock")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("dlock exited by a signal")
}

fn text(out: &Output) -> String {
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits (bounded) until `inspect KEY` gives `want`.
fn await_inspect(url: &str, key: &str, want: i32, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let out = dlock(url, &["inspect", key]);
        if code(&out) == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "inspect {key} never gave {want} within {within:?}: {}",
            text(&out)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The command's exit code, its environment, busy → 75, inspect, release --force.
fn run_exits_and_conflicts(url: &str, name: &str) {
    let key = format!("cli:{name}:{}", std::process::id());
    let out = dlock(url, &["run", &key, "--", "sh", "-c", "exit 3"]);
    assert_eq!(code(&out), 3, "{}", text(&out));

    let out = dlock(
        url,
        &[
            "run",
            &key,
            "--",
            "sh",
            "-c",
            "echo \"$DLOCK_KEY $DLOCK_FENCING_TOKEN\"",
        ],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    let (k, fence) = printed.trim().split_once(' ').expect("key and fence");
    assert_eq!(k, key);
    assert!(fence.parse::<u64>().is_ok(), "{printed}");

    // A holder that runs for a while; a second `run` with --wait 0s exits 75 without running.
    let mut holder = Command::new(DLOCK)
        .env("DLOCK_URL", url)
        .args(["--url", &format!("{url}?client_name=cli-holder")])
        .args(["run", &key, "--ttl", "2s", "--", "sleep", "30"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the holder");
    await_inspect(url, &key, 0, Duration::from_secs(10));
    let out = dlock(
        url,
        &["run", &key, "--wait", "0s", "--", "sh", "-c", "echo ran"],
    );
    assert_eq!(code(&out), 75, "{}", text(&out));
    assert!(out.stdout.is_empty(), "the command ran: {}", text(&out));
    // The conflict names the holder, as `inspect` does.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("`{key}` is held by cli-holder;")),
        "{said}"
    );

    let out = dlock(
        url,
        &["list", "--prefix", &format!("cli:{name}:"), "--json"],
    );
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(listed.contains(&format!("\"key\":\"{key}\"")), "{listed}");
    assert!(listed.contains("\"holder\":\"cli-holder\""), "{listed}");
    let out = dlock(url, &["list", "--prefix", "nothing-here:"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));

    let out = dlock(url, &["inspect", &key, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(json.contains("\"held\":true"), "{json}");
    assert!(json.contains("\"holder\":\"cli-holder\""), "{json}");

    // kill -9 of the holder: the key is free within its ttl (2 s).
    holder.kill().expect("kill -9 the holder");
    holder.wait().unwrap();
    let freed = await_inspect(url, &key, 1, Duration::from_secs(5));
    assert!(
        freed <= Duration::from_millis(2500),
        "freed after {freed:?}"
    );

    // release --force evicts a running holder: it stops its command and exits 76.
    let holder = Command::new(DLOCK)
        .env("DLOCK_URL", url)
        .args([
            "run", &key, "--ttl", "1s", "--grace", "1s", "--", "sleep", "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    await_inspect(url, &key, 0, Duration::from_secs(10));
    let out = dlock(url, &["release", "--force", &key]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let start = Instant::now();
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 76, "{}", text(&out));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let out = dlock(url, &["release", "--force", &key]);
    assert_eq!(code(&out), 1, "nothing left to release: {}", text(&out));
}

#[test]
fn redis() {
    let server = RedisServer::start();
    run_exits_and_conflicts(&server.url(), "redis");
}

/// `list` and `inspect` show who waits on the server: a queue of two
/// processes (written as dlock's waiters write it, one ticket forged with
/// no life left) and how long the oldest has waited.
#[test]
fn list_shows_the_waiting_processes() {
    let server = RedisServer::start();
    let url = server.url();
    let key = format!("cli:waiting:{}", std::process::id());
    let lock = format!("dlock:{{{key}}}");
    server.redis_cli(&[
        "SET",
        &lock,
        "0123456789abcdef0123456789abcdef@holder-1",
        "PX",
        "60000",
    ]);
    let time = server.redis_cli(&["TIME"]);
    let now_ms: u64 = time.lines().next().unwrap().trim().parse::<u64>().unwrap() * 1000;
    let queue = format!("{lock}:queue");
    // The oldest has waited a minute: what the test's own steps take (a
    // loaded machine spawns processes slowly) stays within that minute.
    server.redis_cli(&["ZADD", &queue, &(now_ms - 60_000).to_string(), "a@x"]);
    server.redis_cli(&["ZADD", &queue, &(now_ms - 500).to_string(), "b@y"]);
    let out = dlock(&url, &["inspect", &key]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("held by holder-1")
            && stdout.contains("; 2 processes waiting, the oldest for 1m"),
        "{stdout:?}"
    );
    let out = dlock(&url, &["list", "--prefix", "cli:waiting:", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"waiting_processes\":2"), "{stdout:?}");
    assert!(stdout.contains("\"oldest_wait_ms\":6"), "{stdout:?}");
}

/// SIGTERM to `dlock` goes to the command; the lock is released after it exits.
#[test]
fn a_signal_to_dlock_reaches_the_command() {
    let server = RedisServer::start();
    let url = server.url();
    let key = format!("cli:signal:{}", std::process::id());
    let holder = Command::new(DLOCK)
        .env("DLOCK_URL", &url)
        .args([
            "run",
            &key,
            "--",
            "sh",
            "-c",
            "trap 'exit 7' TERM; sleep 30 & wait",
        ])
        .stdout(Stdio::null())
        // No pipe a process of the command could hold open.
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the holder");
    await_inspect(&url, &key, 0, Duration::from_secs(10));
    // Let the shell install its trap.
    std::thread::sleep(Duration::from_millis(200));
    let status = Command::new("kill")
        .args(["-TERM", &holder.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut holder = holder;
    let status = holder.wait().unwrap();
    assert_eq!(status.code(), Some(7), "{status:?}");
    let out = dlock(&url, &["inspect", &key]);
    assert_eq!(
        code(&out),
        1,
        "released after the command exited: {}",
        text(&out)
    );
}

/// The file backend: no server, a directory of lock files.
#[cfg(target_os = "linux")]
#[test]
fn file() {
    let fixture = dlock_tests::fixtures::file::FileFixture::start();
    run_exits_and_conflicts(&fixture.url, "file");
}

#[test]
fn etcd() {
    let server = EtcdServer::start();
    run_exits_and_conflicts(&server.url(), "etcd");
}

/// `list` on ZooKeeper: two held keys under a prefix, in text and JSON,
/// with their holder; none once the holders exit.
#[test]
fn list_on_zookeeper() {
    let server = ZkServer::start();
    let url = server.url();
    let prefix = format!("cli:list:{}:", std::process::id());
    let keys = [format!("{prefix}a"), format!("{prefix}b/c")];
    let named = if url.contains('?') {
        format!("{url}&client_name=lister-7")
    } else {
        format!("{url}?client_name=lister-7")
    };
    let holders: Vec<_> = keys
        .iter()
        .map(|key| {
            Command::new(DLOCK)
                .args(["--url", &named, "run", key, "--", "sleep", "30"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn a holder")
        })
        .collect();
    for key in &keys {
        await_inspect(&url, key, 0, Duration::from_secs(10));
    }
    let out = dlock(&url, &["list", "--prefix", &prefix]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, key) in lines.iter().zip(&keys) {
        assert!(
            line.starts_with(&format!("{key}: held by lister-7 for ")),
            "{line}"
        );
    }
    let out = dlock(&url, &["list", "--prefix", &prefix, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(
        json.trim().starts_with('[') && json.contains("\"holder\":\"lister-7\""),
        "{json}"
    );
    assert!(json.contains(&format!("\"key\":\"{}\"", keys[1])), "{json}");
    // SIGTERM goes to `sleep`; each `dlock` releases and exits.
    for mut holder in holders {
        Command::new("kill")
            .args(["-TERM", &holder.id().to_string()])
            .status()
            .unwrap();
        holder.wait().unwrap();
    }
    let out = dlock(&url, &["list", "--prefix", &prefix, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    // A prefix no key can start with is a usage error.
    let out = dlock(&url, &["list", "--prefix", "bad\u{7}"]);
    assert_eq!(code(&out), 64, "{}", text(&out));
}

#[test]
fn memory_is_refused_and_a_missing_url_is_named() {
    let out = dlock("memory://", &["inspect", "k"]);
    assert_eq!(code(&out), 64, "{}", text(&out));
    assert!(text(&out).contains("inside one process"), "{}", text(&out));
    let out = Command::new(DLOCK)
        .env_remove("DLOCK_URL")
        .args(["inspect", "k"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 64, "{}", text(&out));
    assert!(text(&out).contains("DLOCK_URL"), "{}", text(&out));
}

/// A key some other client wrote on the server with `ESC[2J`, a newline
/// that forges a second line and a right-to-left override, held under a
/// holder name with a terminal title sequence: `list` (text and JSON) and
/// `inspect` print them escaped, each on one line, with no control
/// character or override reaching the terminal.
#[test]
fn keys_and_holders_from_the_server_print_escaped() {
    let server = RedisServer::start();
    let url = server.url();
    let prefix = format!("cli:esc:{}:", std::process::id());
    let key = format!("{prefix}a\u{1b}[2J\nx: held by forged\u{202e}fdp");
    let holder = "0123456789abcdef0123456789abcdef@evil\u{1b}]0;title\u{7}";
    server.redis_cli(&["SET", &format!("dlock:{{{key}}}"), holder, "PX", "60000"]);
    let raw = |out: &Output| {
        let all = [&out.stdout[..], &out.stderr[..]].concat();
        let text = String::from_utf8_lossy(&all).into_owned();
        text.chars()
            .find(|&c| (c.is_control() && c != '\n') || c == '\u{202e}')
    };

    let out = dlock(&url, &["list", "--prefix", &prefix]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(raw(&out), None, "{stdout:?}");
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
    assert!(
        stdout.starts_with(&format!(
            "{prefix}a\\u{{001B}}[2J\\nx: held by forged\\u{{202E}}fdp: held by evil\\u{{001B}}]0;title\\u{{0007}} for "
        )),
        "{stdout:?}"
    );

    let out = dlock(&url, &["list", "--prefix", &prefix, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(raw(&out), None, "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
    assert!(stdout.contains("\\u202e"), "{stdout:?}");

    // `inspect` of that key: refused as a key no lock may have, the key
    // shown escaped in the error.
    let out = dlock(&url, &["inspect", &key]);
    assert_eq!(code(&out), 64, "{}", text(&out));
    assert_eq!(raw(&out), None, "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
}

/// Holds 3 + 1 permits of a semaphore of 5 in this process, then checks
/// `inspect --semaphore` and `list` (text and JSON) show them; `shows`
/// is how a holder appears (its client name, or the server's session).
fn semaphore_shown(url: &str, named_url: &str, shows: &str, listed: bool) {
    let name = format!("cli:sem:{}:exports", std::process::id());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let held = rt.block_on(async {
        let backend = dlock::connect(named_url).await.unwrap();
        let slots = dlock::Semaphore::new(name.clone(), 5).with_backend(backend);
        let many = slots.acquire_many(3).await;
        let first = match many {
            Ok(permit) => vec![permit],
            // A backend that takes one permit at a time: three of one.
            Err(_) => vec![
                slots.acquire().await.unwrap(),
                slots.acquire().await.unwrap(),
                slots.acquire().await.unwrap(),
            ],
        };
        (first, slots.acquire().await.unwrap())
    });

    let out = dlock(url, &["inspect", "--semaphore", &name]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        line.starts_with(&format!("{name}: 4 of 5 permits held (1 free) by {shows}")),
        "{line}"
    );
    let out = dlock(url, &["inspect", "--semaphore", &name, "--json"]);
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(
        json.contains("\"kind\":\"semaphore\"") && json.contains("\"available\":1"),
        "{json}"
    );

    let prefix = &name[..name.len() - "exports".len()];
    let out = dlock(url, &["list", "--prefix", prefix]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if listed {
        assert!(
            stdout.contains(&format!("semaphore {name}: 4 of 5 permits held")),
            "{}",
            text(&out)
        );
    } else {
        assert!(!stdout.contains("semaphore"), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("semaphores not listed"),
            "{}",
            text(&out)
        );
    }

    rt.block_on(async move {
        let (first, second) = held;
        for permit in first {
            permit.release().await.unwrap();
        }
        second.release().await.unwrap();
    });
    let out = dlock(url, &["inspect", "--semaphore", &name]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{name}: free")
    );
}

fn with_client_name(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}client_name={name}")
}

#[test]
fn semaphores_on_redis() {
    let server = RedisServer::start();
    let url = server.url();
    semaphore_shown(&url, &with_client_name(&url, "sem-7"), "sem-7 (", true);
}

#[test]
fn semaphores_on_files() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let pid = format!("pid {} (", std::process::id());
    semaphore_shown(&url, &url, &pid, true);
}

#[test]
fn semaphores_on_postgres_inspect_but_do_not_list() {
    let server = dlock_tests::servers::postgres::PgServer::start();
    let url = server.url();
    semaphore_shown(&url, &url, "pid ", false);
}
