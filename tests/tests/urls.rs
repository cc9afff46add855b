//! URLs against real servers: a password that holds every delimiter a URL
//! has, percent-encoded, logs in on Redis (an ACL user), etcd (auth) and
//! ZooKeeper (digest); the same password written raw, or a wrong one, is
//! refused with no piece of it shown, in the error or in anything dlock
//! logged (every span and event at TRACE, captured for the whole binary) or
//! recorded as a metric; and a percent-encoded `?prefix=` names the same
//! namespace on every backend (decoded the same everywhere).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock::{Lock, LockBackend, LockError};
use dlock_tests::captured_log::CapturedLog;
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::redis::{RedisOptions, RedisServer};
use dlock_tests::servers::zookeeper::ZkServer;
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use tracing_subscriber::fmt::format::FmtSpan;

/// Every character a URL gives a meaning to, and `%` itself, between two
/// marked ends that cannot occur by chance in a log line.
const PASSWORD: &str = "Hunter2@s/e?c#r%e:t&x=Tail9Zz";
const ENDS: [&str; 2] = ["Hunter2", "Tail9Zz"];

/// Everything dlock logs in this binary (every span's fields, every event,
/// at TRACE) and the metrics it records: installed once, before any test's
/// first step.
fn captured() -> &'static (CapturedLog, Snapshotter) {
    static CAPTURED: OnceLock<(CapturedLog, Snapshotter)> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let log = CapturedLog::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_span_events(FmtSpan::FULL)
            .with_ansi(false)
            .with_writer(log.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder");
        (log, snapshotter)
    })
}

/// No end of the password in anything logged or in any metric's name or
/// labels so far (the logs must not be empty: the capture works).
fn nothing_captured_shows_the_password() {
    let (log, snapshotter) = captured();
    let logged = log.text();
    assert!(
        logged.contains("dlock"),
        "nothing was logged: the capture is broken"
    );
    for end in ENDS {
        assert!(!logged.contains(end), "a log line shows `{end}`");
    }
    for (key, _, _, _) in snapshotter.snapshot().into_vec() {
        let shown = format!("{key:?}");
        assert!(ENDS.iter().all(|end| !shown.contains(end)), "{shown}");
    }
}

/// [`PASSWORD`] as it must be written in a URL.
fn encoded() -> String {
    PASSWORD
        .chars()
        .map(|c| match c {
            '@' | '/' | '?' | '#' | '%' | ':' | '&' | '=' => format!("%{:02X}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    captured();
    tokio::time::timeout(Duration::from_secs(20), dlock::connect(url))
        .await
        .unwrap_or_else(|_| panic!("connect hung: {}", dlock::url::redact(url)))
        .unwrap_or_else(|e| panic!("connect failed: {e}"))
}

/// Locks and releases `key` on `backend`: the credentials worked end to end.
async fn locks(backend: &Arc<dyn LockBackend>, key: &str) {
    let guard = Lock::new(key)
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    guard.release().await.unwrap();
}

/// The raw password (its `/`, `?` and `#` unencoded) is refused by dlock's
/// parser, and a wrong one (the right one with its ends swapped) by the
/// server: neither shows either end of the password.
async fn raw_and_wrong_passwords_are_refused(raw: &str, wrong: &str) {
    let err = dlock::connect(raw).await.expect_err("refused");
    let shown = format!("{err} {err:?}");
    assert!(matches!(err, LockError::InvalidOption { .. }), "{shown}");
    assert!(shown.contains("percent-encode"), "{shown}");
    assert!(ENDS.iter().all(|end| !shown.contains(end)), "{shown}");
    let refused = tokio::time::timeout(Duration::from_secs(20), async {
        let backend = dlock::connect(wrong).await?;
        // etcd and ZooKeeper may log in lazily: the first request is refused.
        Lock::new("urls")
            .with_backend(backend)
            .try_acquire()
            .await?;
        Ok::<_, LockError>(())
    })
    .await
    .expect("a wrong password is refused within 20 s");
    let err = refused.expect_err("a wrong password");
    let shown = format!("{err} {err:?}");
    assert!(ENDS.iter().all(|end| !shown.contains(end)), "{shown}");
    nothing_captured_shows_the_password();
}

/// [`encoded`] with its two ends swapped: a wrong password of the same shape.
fn wrong() -> String {
    encoded()
        .replace(ENDS[0], "Swap")
        .replace(ENDS[1], ENDS[0])
        .replace("Swap", ENDS[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_password_logs_in_on_redis_and_a_raw_one_is_refused() {
    let server = RedisServer::start_with(
        RedisOptions::new()
            .password("default-is-locked-out")
            .acl_user("app", PASSWORD),
    );
    let address = server.url().replace("redis://", "");
    let backend = connect(&format!("redis://app:{}@{address}", encoded())).await;
    locks(&backend, "urls").await;
    assert!(!backend.describe().contains("Pw"), "{}", backend.describe());
    raw_and_wrong_passwords_are_refused(
        &format!("redis://app:{PASSWORD}@{address}"),
        &format!("redis://app:{}@{address}", wrong()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_password_logs_in_on_etcd_and_a_raw_one_is_refused() {
    let server = EtcdServer::start();
    let set_password = format!("--new-user-password={PASSWORD}");
    tokio::task::block_in_place(|| {
        server.etcdctl(&["user", "add", "root", "--interactive=false", &set_password]);
        server.etcdctl(&["auth", "enable"]);
    });
    let backend = connect(&format!("etcd://root:{}@{}", encoded(), server.endpoint())).await;
    locks(&backend, "urls").await;
    raw_and_wrong_passwords_are_refused(
        &format!("etcd://root:{PASSWORD}@{}", server.endpoint()),
        &format!("etcd://root:{}@{}", wrong(), server.endpoint()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_password_logs_in_on_zookeeper_and_a_raw_one_is_refused() {
    let server = ZkServer::start();
    let hosts = server.connect_string();
    let backend = connect(&format!("zk://app:{}@{hosts}", encoded())).await;
    locks(&backend, "urls").await;
    // The same credentials again: the nodes dlock made under them are theirs.
    let again = connect(&format!("zk://app:{}@{hosts}", encoded())).await;
    locks(&again, "urls").await;
    // ZooKeeper's digest takes any password: a wrong one logs in as another
    // identity, which the default ACL (creator: all, anyone: read) keeps
    // from queueing under the key's directory while the lock is held.
    let held = Lock::new("urls")
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    raw_and_wrong_passwords_are_refused(
        &format!("zk://app:{PASSWORD}@{hosts}"),
        &format!("zk://app:{}@{hosts}", wrong()),
    )
    .await;
    held.release().await.unwrap();
}

/// `?prefix=app%2Dx` is the prefix `app-x` on every backend: the lock's
/// data is where `prefix=app-x` puts it, and the two URLs exclude each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_prefix_is_decoded_the_same_on_every_backend() {
    let redis = RedisServer::start();
    let etcd = EtcdServer::start();
    let zk = ZkServer::start();
    for base in [redis.url(), format!("etcd://{}", etcd.endpoint()), zk.url()] {
        let encoded = connect(&format!("{base}?prefix=app%2Dx")).await;
        let plain = connect(&format!("{base}?prefix=app-x")).await;
        let guard = Lock::new("decoded")
            .with_backend(encoded.clone())
            .try_acquire()
            .await
            .unwrap()
            .expect("free");
        let other = Lock::new("decoded")
            .with_backend(plain.clone())
            .try_acquire()
            .await
            .unwrap();
        assert!(
            other.is_none(),
            "{base}: app%2Dx and app-x are one namespace"
        );
        // Where the data is, on the servers dlock's layout is read from outside.
        if base.starts_with("redis") {
            assert_eq!(redis.redis_cli(&["EXISTS", "app-x:{decoded}"]), "1");
        } else if base.starts_with("etcd") {
            let listed = tokio::task::block_in_place(|| {
                etcd.etcdctl(&["get", "--prefix", "--keys-only", "app-x/decoded/"])
            });
            assert!(!listed.trim().is_empty(), "held under app-x/decoded/");
        }
        guard.release().await.unwrap();
    }
}
