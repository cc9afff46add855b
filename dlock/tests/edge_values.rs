//! Values at the edges: `Lock`, `RwLock`, `MultiLock`, `Semaphore` and
//! `SegmentedLock` options and
//! keys driven through their whole ranges (durations 0..=MAX, keys of 0..600
//! bytes of arbitrary UTF-8, counts 0..=usize::MAX) on the memory backend,
//! and URLs with arbitrary passwords on every scheme. Each case must end in
//! a typed answer (a guard or a `LockError`), never a panic or a hang, and
//! no error may show a password.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::memory::MemoryBackend;
use dlock::{
    Lock, LockBackend, LockError, MultiLock, RwLock, SegmentedLock, Semaphore, MAX_KEY_BYTES,
    MAX_TTL, MIN_TTL,
};
use proptest::prelude::*;

/// Durations with their edges weighted in: zero, the limits and one past
/// them, `Duration::MAX`, and anything in between.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(MIN_TTL),
        Just(MIN_TTL - Duration::from_nanos(1)),
        Just(MAX_TTL),
        Just(MAX_TTL + Duration::from_nanos(1)),
        (0u64..3_000).prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// Keys of 0..600 bytes: printable ASCII, arbitrary UTF-8 (control
/// characters included), and lengths around the 512-byte limit.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,600}",
        proptest::collection::vec(any::<char>(), 0..150).prop_map(|c| c.into_iter().collect()),
        (500usize..=520).prop_map(|n| "k".repeat(n)),
        (250usize..=260).prop_map(|n| "é".repeat(n)),
    ]
}

/// Counts with their edges weighted in.
fn count(limit: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(limit),
        Just(limit + 1),
        Just(usize::MAX),
        2usize..8,
        any::<usize>(),
    ]
}

fn key_is_valid(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_BYTES
        && !key
            .chars()
            .any(|c| c.is_control() || dlock::backend::invisible_char(c).is_some())
}

fn ttl_is_valid(ttl: Duration) -> bool {
    (MIN_TTL..=MAX_TTL).contains(&ttl)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `work` with a bound: a hang is a failure, not a stuck test.
fn bounded<T>(runtime: &tokio::runtime::Runtime, work: impl std::future::Future<Output = T>) -> T {
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), work).await })
        .expect("hung for 10 s")
}

/// A release succeeded, or found the lease already lost: a ttl of a few milliseconds
/// (`MIN_TTL` and up) can lapse between two renewals on a busy machine, and the release of a
/// lost lease answers `NotHeld`. With a ttl of a second or more, nothing may be lost.
fn released(result: Result<(), LockError>, ttl: Duration) {
    match result {
        Ok(()) => {}
        Err(LockError::NotHeld { .. }) if ttl < Duration::from_secs(1) => {
            // Lost by its local deadline, which comes before the backend's
            // own expiry (the drift margin): wait that out, so the next
            // attempt finds the key free as it would on a quiet machine.
            std::thread::sleep(ttl);
        }
        Err(e) => panic!("release with ttl {ttl:?} failed: {e:?}"),
    }
}

/// The answer for invalid input names what was wrong.
fn assert_typed(err: &LockError, key_ok: bool) {
    let expected = if key_ok {
        matches!(err, LockError::InvalidOption { .. })
    } else {
        matches!(err, LockError::InvalidKey { .. })
    };
    assert!(expected, "unexpected error: {err:?}");
    assert!(!err.to_string().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn lock_options_give_a_guard_or_a_typed_error(
        key in key(), ttl in duration(), wait in proptest::option::of(duration()), renew in any::<bool>(),
    ) {
        let runtime = runtime();
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let mut lock = Lock::new(key.clone()).ttl(ttl).renew(renew).with_backend(backend);
        if let Some(wait) = wait {
            lock = lock.wait(wait);
        }
        let valid = key_is_valid(&key) && ttl_is_valid(ttl);
        for once in [false, true] {
            let attempt = if once {
                bounded(&runtime, lock.try_acquire())
            } else {
                bounded(&runtime, lock.acquire()).map(Some)
            };
            match attempt {
                Ok(Some(guard)) => {
                    prop_assert!(valid, "accepted key {key:?} with ttl {ttl:?}");
                    // A lease of a few ms may already be lost on a busy machine
                    // (the thread descheduled past its local deadline).
                    prop_assert!(guard.is_held() || ttl < Duration::from_secs(1));
                    prop_assert!(guard.fencing_token().is_some());
                    released(bounded(&runtime, guard.release()), ttl);
                }
                Ok(None) => prop_assert!(false, "a free key was reported held"),
                Err(e) => {
                    prop_assert!(!valid, "refused valid input: {e:?}");
                    assert_typed(&e, key_is_valid(&key));
                }
            }
        }
    }

    #[test]
    fn rw_options_give_a_read_or_write_guard_or_a_typed_error(
        key in key(), ttl in duration(), wait in duration(), write in any::<bool>(),
    ) {
        let runtime = runtime();
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let lock = RwLock::new(key.clone()).ttl(ttl).wait(wait).with_backend(backend);
        let valid = key_is_valid(&key) && ttl_is_valid(ttl);
        let taken = if write {
            bounded(&runtime, lock.write())
        } else {
            bounded(&runtime, lock.read())
        };
        match taken {
            Ok(guard) => {
                prop_assert!(valid, "accepted key {key:?} with ttl {ttl:?}");
                prop_assert!(guard.fencing_token().is_some());
                released(bounded(&runtime, guard.release()), ttl);
            }
            Err(e) => {
                prop_assert!(!valid, "refused valid input: {e:?}");
                assert_typed(&e, key_is_valid(&key));
            }
        }
    }

    #[test]
    fn multi_options_give_every_key_or_a_typed_error(
        keys in proptest::collection::vec(key(), 0..5), ttl in duration(), wait in duration(),
    ) {
        let runtime = runtime();
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let lock = MultiLock::new(keys.clone()).ttl(ttl).wait(wait).with_backend(backend);
        let keys_ok = !keys.is_empty() && keys.iter().all(|k| key_is_valid(k));
        let valid = keys_ok && ttl_is_valid(ttl);
        match bounded(&runtime, lock.acquire()) {
            Ok(guard) => {
                prop_assert!(valid, "accepted keys {keys:?} with ttl {ttl:?}");
                prop_assert_eq!(guard.keys().count(), lock.keys().len());
                released(bounded(&runtime, guard.release()), ttl);
            }
            Err(e) => {
                prop_assert!(!valid, "refused valid input: {e:?}");
                // No keys is an option error; a bad key is named.
                assert_typed(&e, keys_ok || keys.is_empty());
            }
        }
    }

    #[test]
    fn semaphore_options_give_a_permit_or_a_typed_error(
        name in key(), permits in count(Semaphore::MAX_PERMITS), ttl in duration(), wait in duration(),
    ) {
        let runtime = runtime();
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let semaphore = Semaphore::new(name.clone(), permits).ttl(ttl).wait(wait).with_backend(backend);
        let valid = key_is_valid(&name)
            && ttl_is_valid(ttl)
            && (1..=Semaphore::MAX_PERMITS).contains(&permits);
        match bounded(&runtime, semaphore.acquire()) {
            Ok(permit) => {
                prop_assert!(valid, "accepted {name:?}, {permits} permits, ttl {ttl:?}");
                released(bounded(&runtime, permit.release()), ttl);
            }
            Err(e) => {
                prop_assert!(!valid, "refused valid input: {e:?}");
                let name_ok = key_is_valid(&name);
                // Counts are checked first: a bad count with a bad name is
                // an option error.
                let count_ok = (1..=Semaphore::MAX_PERMITS).contains(&permits);
                assert_typed(&e, name_ok || !count_ok);
            }
        }
    }

    #[test]
    fn segmented_options_give_a_segment_or_a_typed_error(
        key in key(), segments in count(SegmentedLock::MAX_SEGMENTS), ttl in duration(), wait in duration(),
    ) {
        let runtime = runtime();
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let lock = SegmentedLock::new(key.clone(), segments).ttl(ttl).wait(wait).with_backend(backend);
        let count_ok = (1..=SegmentedLock::MAX_SEGMENTS).contains(&segments);
        let keys_ok = count_ok
            && key_is_valid(&key)
            && key_is_valid(&lock.segment_key(segments - 1));
        let valid = count_ok && keys_ok && ttl_is_valid(ttl);
        match bounded(&runtime, lock.acquire()) {
            Ok(guard) => {
                prop_assert!(valid, "accepted {key:?} with {segments} segments, ttl {ttl:?}");
                prop_assert!(guard.segment().is_some_and(|s| s < segments));
                released(bounded(&runtime, guard.release()), ttl);
            }
            Err(e) => {
                prop_assert!(!valid, "refused valid input: {e:?}");
                assert_typed(&e, keys_ok || !count_ok);
            }
        }
    }
}

/// The schemes this build can connect to.
fn schemes() -> Vec<&'static str> {
    let mut schemes = vec!["memory", "nosuchscheme"];
    if cfg!(feature = "redis") {
        schemes.extend(["redis", "redis+cluster", "redis+sentinel"]);
    }
    if cfg!(all(feature = "redis", feature = "tls")) {
        schemes.extend(["rediss", "rediss+sentinel"]);
    }
    if cfg!(feature = "redlock") {
        schemes.push("redlock");
    }
    if cfg!(feature = "etcd") {
        schemes.push("etcd");
    }
    if cfg!(all(feature = "etcd", feature = "tls")) {
        schemes.push("etcds");
    }
    if cfg!(feature = "zookeeper") {
        schemes.push("zk");
    }
    if cfg!(all(feature = "zookeeper", feature = "tls")) {
        schemes.push("zks");
    }
    if cfg!(feature = "postgres") {
        schemes.extend(["postgres", "postgresql"]);
    }
    if cfg!(all(feature = "file", target_os = "linux")) {
        schemes.push("file");
    }
    if cfg!(feature = "mysql") {
        schemes.push("mysql");
    }
    if cfg!(all(feature = "mysql", feature = "tls")) {
        schemes.push("mysqls");
    }
    schemes
}

proptest! {
    // Every case connects once per scheme and URL shape (to a closed
    // loopback port, or fails to parse): fewer cases keep it quick.
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

    #[test]
    fn no_error_shows_a_password(
        secret in "[A-Za-z0-9#?/@:!$&'()*+,;=~.\\[\\]_-]{1,16}",
    ) {
        // A marker around it, so that it cannot occur by chance in a host or port.
        let password = format!("Pw{secret}Zq");
        let runtime = runtime();
        for scheme in schemes() {
            for url in [
                format!("{scheme}://user:{password}@127.0.0.1:1"),
                format!("{scheme}://{password}@127.0.0.1:1"),
                format!("{scheme}://user:{password}@127.0.0.1:1,127.0.0.1:2/0?timeout=300ms"),
                format!("{scheme}://user:{password}@"),
                format!("{scheme}:/user:{password}@127.0.0.1:1"),
                format!("{scheme}://127.0.0.1:1/mm?sentinel_user=u&sentinel_password={password}&db=0"),
            ] {
                let answer = runtime.block_on(async {
                    tokio::time::timeout(Duration::from_secs(20), dlock::connect(&url)).await
                });
                let shown = match answer {
                    Ok(Ok(backend)) => format!("{backend:?} {}", backend.describe()),
                    Ok(Err(e)) => format!("{e} {e:?}"),
                    Err(_) => panic!("connect({url:?}) hung for 20 s"),
                };
                prop_assert!(!shown.contains(&password), "{url:?} showed its password: {shown}");
            }
        }
    }
}

/// A password with a raw `?`, `/`, `#` or `?x=1&` in it, cut into two
/// marked halves: no half may show in any error, on any scheme, in the
/// one-host and the host-list forms; and dlock's own parser refuses it
/// (`InvalidOption`, "percent-encode") before any network I/O, so no piece
/// of it can go out as a host name to look up.
#[test]
fn no_piece_of_a_password_shows() {
    let runtime = runtime();
    let (head, tail) = ("Hunter2Secret", "Tail9Zz");
    for scheme in schemes() {
        for separator in ["?", "/", "#", "?x=1&"] {
            let password = format!("{head}{separator}{tail}");
            for url in [
                format!("{scheme}://app:{password}@127.0.0.1:1"),
                format!("{scheme}://{password}@127.0.0.1:1"),
                format!("{scheme}://app:{password}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"),
                format!("{scheme}://app:{password}@127.0.0.1:1,127.0.0.1:2/mm?db=0"),
            ] {
                let answer = runtime.block_on(async {
                    tokio::time::timeout(Duration::from_secs(20), dlock::connect(&url)).await
                });
                let err = match answer {
                    Ok(Ok(backend)) => {
                        let shown = format!("{backend:?} {}", backend.describe());
                        assert!(
                            !shown.contains(head) && !shown.contains(tail),
                            "{url:?}: {shown}"
                        );
                        assert_eq!(scheme, "memory", "{url:?} connected");
                        continue;
                    }
                    Ok(Err(e)) => e,
                    Err(_) => panic!("connect({url:?}) hung for 20 s"),
                };
                let shown = format!("{err} {err:?}");
                assert!(
                    !shown.contains(head) && !shown.contains(tail),
                    "{url:?} showed a piece of its password: {shown}"
                );
                // A file URL takes no host or credentials: refused as not
                // an absolute path, before any file system call.
                if scheme == "file" {
                    assert!(
                        matches!(err, LockError::InvalidOption { .. })
                            && shown.contains("absolute"),
                        "{url:?}: {shown}"
                    );
                } else if !["memory", "nosuchscheme"].contains(&scheme) {
                    assert!(
                        matches!(err, LockError::InvalidOption { .. })
                            && shown.contains("percent-encode the password"),
                        "{url:?}: refused by dlock's parser before any I/O, got {shown}"
                    );
                }
            }
        }
    }
}

/// A prefix that could spell a name of another namespace is refused at
/// connect, the same on every backend that takes one, before any I/O: a `/`
/// (a directory inside another prefix), braces (Redis Cluster's hash tag),
/// an internal root's ending, a reserved name. Escapes decode first, so
/// `%2F` is a `/` too.
#[test]
fn prefixes_that_reach_another_namespace_are_refused() {
    let runtime = runtime();
    let with_prefix: Vec<&str> = schemes()
        .into_iter()
        .filter(|scheme| !["memory", "nosuchscheme"].contains(scheme))
        .collect();
    for scheme in with_prefix {
        let base = match scheme {
            "file" => format!("file://{}", std::env::temp_dir().display()),
            "redis+sentinel" | "rediss+sentinel" => format!("{scheme}://127.0.0.1:1/mm"),
            "redis" | "rediss" => format!("{scheme}://127.0.0.1:1"),
            _ => format!("{scheme}://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"),
        };
        for (prefix, says) in [
            ("app/x", "`/`"),
            ("app%2Fx", "`/`"),
            ("{x}", "hash tag"),
            ("a{}", "hash tag"),
            ("{}", "hash tag"),
            ("dlock-semaphores", "-semaphores"),
            ("dlock-rw", "-rw"),
            ("dlock-election", "-election"),
            ("zookeeper", "keep for themselves"),
            ("", "empty"),
        ] {
            let url = format!("{base}?prefix={prefix}");
            let answer = runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(20), dlock::connect(&url)).await
            });
            match answer {
                Ok(Err(err @ LockError::InvalidOption { .. })) => {
                    let shown = err.to_string();
                    assert!(
                        shown.contains("prefix=") && shown.contains(says),
                        "{url}: {shown}"
                    );
                }
                Ok(Err(err)) => panic!("{url}: not refused as an option: {err}"),
                Ok(Ok(_)) => panic!("{url}: connected"),
                Err(_) => panic!("connect({url:?}) hung for 20 s"),
            }
        }
    }
}

/// No URL parameter is silently ignored, on any scheme: an unknown one, a
/// typo and another backend's are `InvalidOption` errors naming it (a typo
/// with the closest known name), before any I/O; durations take one syntax.
#[test]
fn no_url_parameter_is_ignored() {
    let runtime = runtime();
    for scheme in schemes() {
        if scheme == "nosuchscheme" {
            continue;
        }
        let base = match scheme {
            "memory" => "memory://".to_owned(),
            "file" => format!("file://{}", std::env::temp_dir().display()),
            "redis" | "rediss" => format!("{scheme}://127.0.0.1:1"),
            "redis+sentinel" | "rediss+sentinel" => format!("{scheme}://127.0.0.1:1/mm"),
            // One server, a user and a database: the parameters are what is wrong.
            "mysql" | "mysqls" => format!("{scheme}://u@127.0.0.1:1/db"),
            _ => format!("{scheme}://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"),
        };
        let mut cases = vec![("nosuchoption=1", "nosuchoption".to_owned())];
        if scheme != "memory" {
            cases.push(("prefx=app", "did you mean `prefix`?".to_owned()));
        }
        let foreign = if scheme.starts_with("zk")
            || scheme.starts_with("postgres")
            || scheme.starts_with("mysql")
        {
            "timeout_ms=5"
        } else {
            "session_timeout=5s"
        };
        if scheme != "memory" {
            cases.push((foreign, "is a parameter of".to_owned()));
        }
        for (query, says) in cases {
            let url = format!("{base}?{query}");
            let answer = runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(20), dlock::connect(&url)).await
            });
            match answer {
                Ok(Err(err @ LockError::InvalidOption { .. })) => {
                    assert!(err.to_string().contains(&says), "{url}: {err}");
                }
                Ok(Err(err)) => panic!("{url}: not refused as an option: {err}"),
                Ok(Ok(_)) => panic!("{url}: connected, ignoring `{query}`"),
                Err(_) => panic!("connect({url:?}) hung for 20 s"),
            }
        }
    }
}

/// Malformed URLs of every scheme get a typed error naming what is wrong,
/// never a panic or a hang (or they connect, where the form is valid).
#[test]
fn malformed_urls_get_clean_errors() {
    let runtime = runtime();
    let mut urls: Vec<String> = [
        "",
        "://",
        "redis",
        "redis:/",
        "redis//h:1",
        "unknown://h:1",
        "memory://x?y=z",
        "redis://",
        "redis://:",
        "redis://h:notaport",
        "redis://h:99999",
        "redis://[::1",
        "redis://h:1/notadb",
        "redis://h:1?timeout_ms=-1",
        "redis://h:1?timeout_ms=x",
        "redis://h:1?nosuchoption=1",
        "redis+cluster://",
        "redis+cluster://h:1,",
        "redis+sentinel://",
        "redis+sentinel://h:1",
        "redis+sentinel://h:1/",
        "redis+sentinel://h:x/mm",
        "redis+sentinel://h:1/mm?db=x",
        "redis+sentinel://h:1/mm?nosuchoption=1",
        "redis+sentinel://127.0.0.1:1/mm",
        "rediss+sentinel://h:1/mm?ca=",
        "rediss://h:1?ca=",
        "redlock://",
        "redlock://h:1",
        "redlock://h:1,,h:2",
        "etcd://",
        "etcd://,",
        "etcd://h:1?timeout=0s",
        "etcd://h:1?timeout=abc",
        "etcds://h:1",
        "zk://",
        "zk://h:1?session_timeout=abc",
        "zk://h:1/chroot/",
        "zk://h:badport",
        "file://",
        "file://relative/dir",
        "file:///nonexistent/dlock-dir",
        "file:///dev/null",
        "file:///tmp?mode=9",
        "file:///tmp/%zz",
    ]
    .iter()
    .map(|u| u.to_string())
    .collect();
    urls.push(format!("redis://h:1/{}", "9".repeat(40)));
    for url in urls {
        let answer = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), dlock::connect(&url)).await
        });
        match answer {
            Err(_) => panic!("connect({url:?}) hung for 20 s"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                assert!(
                    matches!(
                        e,
                        LockError::InvalidOption { .. } | LockError::Backend { .. }
                    ),
                    "{url:?}: {e:?}"
                );
                assert!(!e.to_string().is_empty(), "{url:?}");
            }
        }
    }
}
