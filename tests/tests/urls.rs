//! URLs against real servers: a password that holds every delimiter a URL
//! has, percent-encoded, logs in on Redis (an ACL user), etcd (auth) and
//! ZooKeeper (digest); the same password written raw is refused before any
//! I/O with no piece of it shown; and a percent-encoded `?prefix=` names the
//! same namespace on every backend (decoded the same everywhere).

use std::sync::Arc;
use std::time::Duration;

use dlock::{Lock, LockBackend, LockError};
use dlock_tests::servers::etcd::EtcdServer;
use dlock_tests::servers::redis::{RedisOptions, RedisServer};
use dlock_tests::servers::zookeeper::ZkServer;

/// Every character a URL gives a meaning to, and `%` itself.
const PASSWORD: &str = "Pw@s/e?c#r%e:t&x=Zq";

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
/// parser, and neither of its ends shows.
async fn raw_password_is_refused(url: &str) {
    let err = dlock::connect(url).await.err().expect("refused");
    let shown = format!("{err} {err:?}");
    assert!(matches!(err, LockError::InvalidOption { .. }), "{shown}");
    assert!(shown.contains("percent-encode"), "{shown}");
    assert!(!shown.contains("Pw") && !shown.contains("Zq"), "{shown}");
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
    raw_password_is_refused(&format!("redis://app:{PASSWORD}@{address}")).await;
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
    raw_password_is_refused(&format!("etcd://root:{PASSWORD}@{}", server.endpoint())).await;
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
    raw_password_is_refused(&format!("zk://app:{PASSWORD}@{hosts}")).await;
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
