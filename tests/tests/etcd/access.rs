//! Auth, bad URLs, TLS, and refusals that name the missing grant.

use super::*;

/// User/password auth: the right password works, a wrong one is a `Backend`
/// error that does not show the password, and `describe()` hides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_auth() {
    let server = EtcdServer::start();
    blocking(|| {
        server.etcdctl(&["user", "add", "root:R00t-pw"]);
        server.etcdctl(&["auth", "enable"]);
    });
    let url = format!("etcd://root:R00t-pw@{}", server.endpoint());
    let backend = connect(&url).await;
    assert_eq!(
        backend.describe(),
        format!("etcd://root:***@{}", server.endpoint())
    );
    let guard = lock(&backend, "auth").acquire().await.unwrap();
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();

    let wrong = format!("etcd://root:not-the-Pw@{}", server.endpoint());
    let err = EtcdBackend::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("not-the-Pw"), "{shown}");
}

/// A URL that cannot work is a clear `InvalidOption`, never a panic.
#[tokio::test]
async fn bad_urls_are_invalid_options() {
    for url in [
        "etcd://",
        "etcd://h:99999",
        "etcd://h?nope=1",
        "etcds://h:2379",
        "etcds://h:2379?ca=/nonexistent/ca.pem",
    ] {
        invalid_option(url).await;
    }
    // Nothing listens there: a transport failure, reported as such.
    let port = dlock_tests::servers::ports::free_port().unwrap();
    let err = dlock::connect(&format!("etcd://127.0.0.1:{port}?timeout=1s"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

/// `etcds://` with a CA file: a TLS-only member is reached and locks work;
/// a plain `etcd://` URL to the same port is a `Backend` error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_file() {
    use dlock_tests::servers::ports::free_port;
    use dlock_tests::servers::process::{ProcessSpec, ServerProcess};
    use dlock_tests::tls::TestCerts;

    let dir = tempfile::tempdir().unwrap();
    let certs = TestCerts::generate(dir.path()).unwrap();
    let (client_port, peer_port) = (free_port().unwrap(), free_port().unwrap());
    let client_url = format!("https://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let etcd = require_binary("etcd", ETCD_PACKAGES).unwrap_or_else(|e| panic!("{e}"));
    let spec = ProcessSpec::new("etcd tls", etcd, dir.path().join("etcd.log"))
        .args(["--name", "tls", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("tls={peer_url}")])
        .arg("--cert-file")
        .arg(certs.server_cert_path())
        .arg("--key-file")
        .arg(certs.server_key_path());
    let _server = ServerProcess::spawn(spec).unwrap();

    let url = format!(
        "etcds://127.0.0.1:{client_port}?ca={}&timeout=2s",
        certs.ca_cert_path().display()
    );
    // Ready when a TLS client gets through (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    let a: Arc<dyn LockBackend> = loop {
        match EtcdBackend::connect(&url).await {
            Ok(backend) => break Arc::new(backend),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the TLS etcd never answered: {e}"),
        }
    };
    let b = connect(&url).await;
    let guard = lock(&a, "tls").acquire().await.unwrap();
    assert!(lock(&b, "tls").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    assert!(lock(&b, "tls").try_acquire().await.unwrap().is_some());

    let plain = format!("etcd://127.0.0.1:{client_port}?timeout=2s");
    let err = tokio::time::timeout(Duration::from_secs(10), EtcdBackend::connect(&plain))
        .await
        .expect("a plain connect to a TLS port hung")
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

/// A user whose role may use `dlock/` only: locks work; a read-write lock
/// and a semaphore are refused with an error that names them and the
/// prefix the role lacks, with etcd's own message kept. A user with no
/// grant at all is refused at connect, told the three prefixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_the_key_and_the_missing_grant() {
    let server = EtcdServer::start();
    blocking(|| {
        for args in [
            &["user", "add", "root:root-pw"][..],
            &["role", "add", "locks"],
            &[
                "role",
                "grant-permission",
                "--prefix=true",
                "locks",
                "readwrite",
                "dlock/",
            ],
            &["user", "add", "app:app-pw"],
            &["user", "grant-role", "app", "locks"],
            &["user", "add", "nobody:nobody-pw"],
            &["auth", "enable"],
        ] {
            server.etcdctl(args);
        }
    });
    let url = format!("etcd://app:app-pw@{}", server.endpoint());
    let backend = connect(&url).await;
    let guard = lock(&backend, "jobs").acquire().await.unwrap();
    guard.release().await.unwrap();

    let err = dlock::RwLock::new("prices")
        .with_backend(backend.clone())
        .try_write()
        .await
        .unwrap_err();
    let shown = err.to_string();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    for part in [
        "read-write lock `prices`",
        "`dlock-rw/`",
        "permission denied",
    ] {
        assert!(shown.contains(part), "{part:?} not in: {shown}");
    }
    assert!(!shown.contains("app-pw"), "{shown}");

    let err = dlock::Semaphore::new("exports", 2)
        .with_backend(backend.clone())
        .try_acquire()
        .await
        .unwrap_err();
    let shown = err.to_string();
    for part in [
        "semaphore `exports`",
        "`dlock-semaphores/`",
        "permission denied",
    ] {
        assert!(shown.contains(part), "{part:?} not in: {shown}");
    }

    let nobody = format!("etcd://nobody:nobody-pw@{}", server.endpoint());
    let err = EtcdBackend::connect(&nobody).await.unwrap_err();
    let shown = err.to_string();
    for part in [
        "`dlock/`",
        "`dlock-rw/`",
        "`dlock-semaphores/`",
        "permission denied",
    ] {
        assert!(shown.contains(part), "{part:?} not in: {shown}");
    }
    assert!(!shown.contains("nobody-pw"), "{shown}");
}
