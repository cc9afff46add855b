//! `zks://`: TLS to ZooKeeper.

use super::*;

/// A standalone server with a TLS port serving `certs`' server certificate
/// (and asking for a client certificate if `need_client_cert`).
async fn tls_server(certs: &TestCerts, need_client_cert: bool) -> ZkServer {
    let tls = ZkTls {
        cert: certs.server_cert_path().to_owned(),
        key: certs.server_key_path().to_owned(),
        ca: certs.ca_cert_path().to_owned(),
        need_client_cert,
    };
    tokio::task::spawn_blocking(move || ZkServer::start_tls(&tls))
        .await
        .expect("starting ZooKeeper with TLS panicked")
}

/// `zks://<host>:<TLS port>?ca=<ca>` plus `rest`.
fn zks_url(server: &ZkServer, host: &str, ca: &std::path::Path, rest: &str) -> String {
    format!(
        "zks://{host}:{}?ca={}&session_timeout={}ms{rest}",
        server.secure_port().expect("a TLS server"),
        ca.display(),
        SESSION_TIMEOUT.as_millis()
    )
}

/// A `connect` that must fail, within a bound: the error.
async fn refused(url: &str) -> LockError {
    let answer = tokio::time::timeout(Duration::from_secs(20), ZooKeeperBackend::connect(url))
        .await
        .unwrap_or_else(|_| panic!("connect({url}) hung"));
    match answer {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e,
    }
}

/// Issue 31, case 5: `zks://` locks over TLS (with digest credentials, which
/// then never cross the wire in clear text, and a client certificate the
/// server demands), with fencing tokens; without the client certificate the
/// server refuses the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_locks_with_fencing_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCerts::generate(dir.path()).unwrap();
    let server = tls_server(&certs, true).await;
    let identity = format!(
        "&cert={}&key={}",
        certs.client_cert_path().display(),
        certs.client_key_path().display()
    );
    let url = zks_url(&server, "127.0.0.1", certs.ca_cert_path(), &identity).replacen(
        "zks://",
        "zks://app:pw-over-tls@",
        1,
    );
    let a = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    let b = Arc::new(ZooKeeperBackend::connect(&url).await.unwrap());
    assert!(!a.describe().contains("pw-over-tls"), "{}", a.describe());
    let first = lock(&a, "over-tls").acquire().await.unwrap();
    let fence = first.fencing_token().expect("a fencing token");
    assert!(lock(&b, "over-tls").try_acquire().await.unwrap().is_none());
    first.release().await.unwrap();
    let second = lock(&b, "over-tls").try_acquire().await.unwrap().unwrap();
    assert!(second.fencing_token().unwrap() > fence);
    second.release().await.unwrap();

    let localhost = zks_url(&server, "localhost", certs.ca_cert_path(), &identity);
    let by_name = ZooKeeperBackend::connect(&localhost).await.unwrap();
    drop(by_name);
    let no_cert = zks_url(&server, "127.0.0.1", certs.ca_cert_path(), "");
    let err = refused(&no_cert).await;
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

/// `zks://` refuses a server whose certificate an unknown CA signed, and one
/// whose certificate names another host; a `zks://` URL without `?ca=` is an
/// `InvalidOption` before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_refuses_an_unknown_ca_and_a_wrong_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCerts::generate(&dir.path().join("good").tap_mkdir()).unwrap();
    let stranger = TestCerts::generate(&dir.path().join("stranger").tap_mkdir()).unwrap();
    let server = tls_server(&certs, false).await;
    let err = refused(&zks_url(&server, "127.0.0.1", stranger.ca_cert_path(), "")).await;
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("over TLS"), "{err}");

    let elsewhere = TestCerts::generate_for_host(
        &dir.path().join("elsewhere").tap_mkdir(),
        "elsewhere.invalid",
    )
    .unwrap();
    let misnamed = tls_server(&elsewhere, false).await;
    for host in ["127.0.0.1", "localhost"] {
        let err = refused(&zks_url(&misnamed, host, elsewhere.ca_cert_path(), "")).await;
        assert!(matches!(err, LockError::Backend { .. }), "{host}: {err:?}");
    }
    // The servers saw the client end each handshake with an alert: the
    // refusals are TLS's, not a server that was not there.
    for server in [&server, &misnamed] {
        let log = server.process().log_tail();
        assert!(log.contains("Received fatal alert"), "{log}");
    }
    // The same CA and port, with the name checked right, connect: the
    // refusals above are the CA's and the name's.
    ZooKeeperBackend::connect(&zks_url(&server, "127.0.0.1", certs.ca_cert_path(), ""))
        .await
        .unwrap();

    let port = server.secure_port().unwrap();
    for (url, says) in [
        (format!("zks://127.0.0.1:{port}"), "?ca="),
        (format!("zks://app:pw@127.0.0.1:{port}?ca="), "PEM file"),
        (
            format!("zks://127.0.0.1:{port}?ca=/nonexistent/ca.pem"),
            "cannot read the CA file",
        ),
    ] {
        let err = refused(&url).await;
        assert!(
            matches!(err, LockError::InvalidOption { .. }),
            "{url}: {err:?}"
        );
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}

/// Creates the directory (for certificates) and returns it.
trait TapMkdir {
    fn tap_mkdir(self) -> std::path::PathBuf;
}

impl TapMkdir for std::path::PathBuf {
    fn tap_mkdir(self) -> std::path::PathBuf {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}
