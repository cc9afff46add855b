//! TLS to PostgreSQL (features `postgres` and `tls`) against real servers
//! started with `ssl=on`: locks over `sslmode=verify-full` (every session
//! and the listener encrypted, as the server's `pg_stat_ssl` shows), each
//! mode's certificate checks (a CA that did not sign the server's
//! certificate, a host name the certificate does not name), `require` and
//! `prefer` against a server without TLS, client certificates
//! (`clientcert=verify-full`), SCRAM channel binding, bad files, and the
//! conformance, segment, multi-key, read-write and semaphore suites over TLS.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::postgres::PostgresBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::fixtures::postgres::PgFixture;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::sql_servers::{connected, held_with_a_waiter, refused_within};
use dlock_tests::tls::TestCerts;

/// The bound on a refused connection: the URL's `connect_timeout=2`, and a
/// second for the rest.
const REFUSED_WITHIN: Duration = Duration::from_secs(3);

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    connected(url, PostgresBackend::connect).await
}

/// `PostgresBackend::connect(url)`'s error, checked to come within
/// [`REFUSED_WITHIN`] and not to show the URL's password.
async fn refused(url: &str) -> LockError {
    let err = refused_within(url, REFUSED_WITHIN, PostgresBackend::connect).await;
    assert!(
        !err.to_string().contains("hunter2"),
        "the password leaked: {err}"
    );
    err
}

/// The backend's connections to `server` (by `application_name`):
/// (encrypted, plain).
fn connections(server: &PgServer, app: &str) -> (u32, u32) {
    let out = server.psql(&format!(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = '{app}'"
    ));
    let (tls, plain) = out.split_once('|').unwrap_or_else(|| panic!("psql: {out}"));
    (tls.parse().unwrap(), plain.parse().unwrap())
}

/// `sslmode=verify-full` with the test CA: locks exclude each other, a
/// waiter is woken through the (encrypted) listener, fencing tokens
/// increase, and every connection of both clients is TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_verify_full() {
    let server = PgServer::start_tls();
    let url = format!("{}&application_name=dlock-tls&sessions=2", server.tls_url());
    // A waiter on `b` listens for the release (its LISTEN connection is
    // opened now), and gets the key when `a` lets go.
    let queued = held_with_a_waiter(
        &url,
        PostgresBackend::connect,
        "tls-key",
        Duration::from_secs(20),
    );
    let queued = queued.await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (tls, plain) = connections(&server, "dlock-tls");
    assert!(tls >= 3 && plain == 0, "encrypted {tls}, plain {plain}");
    let (next, took, _clients) = queued.release_and_serve().await;
    assert!(
        took < Duration::from_millis(900),
        "woken by the listener, not the re-check: {took:?}"
    );
    let (tls, plain) = connections(&server, "dlock-tls");
    assert!(tls >= 3 && plain == 0, "encrypted {tls}, plain {plain}");
    let versions = server.psql(
        "SELECT string_agg(DISTINCT s.version, ',') FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'dlock-tls'",
    );
    assert!(versions.starts_with("TLSv1."), "{versions}");
    next.release().await.unwrap();
}

/// A server certificate the client cannot trust is refused, clearly and in
/// time, whatever mode checks it; the same server with the right CA works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_refused() {
    let server = PgServer::start_tls();
    let elsewhere = tempfile::tempdir().unwrap();
    let stranger = TestCerts::generate(elsewhere.path()).unwrap();
    let base = format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/postgres?connect_timeout=2",
        server.port()
    );
    let wrong_ca = stranger.ca_cert_path().display().to_string();
    // `require` with a root certificate checks the chain (libpq's rule).
    for mode in ["verify-full", "verify-ca", "require", "prefer"] {
        let url = format!("{base}&sslmode={mode}&sslrootcert={wrong_ca}");
        let err = refused(&url).await;
        let text = err.to_string();
        assert!(matches!(err, LockError::Backend { .. }), "{mode}: {err:?}");
        // The stranger CA has the same name as the server's: the
        // signature does not verify (`BadSignature`; another name would be
        // `UnknownIssuer`).
        assert!(
            text.contains("TLS handshake")
                && text.contains("invalid peer certificate")
                && text.contains("not signed by a CA of `sslrootcert`"),
            "{mode}: {text}"
        );
    }
    // Without a root certificate, `require` checks none (libpq's
    // `require`): it connects, encrypted.
    let any = connect(&format!("{base}&sslmode=require&application_name=any-cert")).await;
    assert_eq!(connections(&server, "any-cert"), (1, 0));
    drop(any);
    // The trusted CA: every mode connects.
    let ca = server.ca_cert_path().unwrap().display().to_string();
    for mode in ["verify-full", "verify-ca", "require", "prefer"] {
        let url = format!("{base}&sslmode={mode}&sslrootcert={ca}");
        connect(&url).await;
    }
}

/// `verify-full` checks the host name: a certificate for another name is
/// refused at 127.0.0.1, while `verify-ca` (the chain only) accepts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_checks_the_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCerts::generate_for_host(dir.path(), "db.dlock.invalid").unwrap();
    let server = PgServer::start_tls_with(&certs);
    let base = format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/postgres?connect_timeout=2&sslrootcert={}",
        server.port(),
        certs.ca_cert_path().display()
    );
    let err = refused(&format!("{base}&sslmode=verify-full")).await;
    let text = err.to_string();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(
        text.contains("TLS handshake")
            && text.contains("certificate not valid for name \"127.0.0.1\"")
            && text.contains("does not name the host"),
        "{text}"
    );
    // Issue 42, case 10: no advice that weakens the check.
    assert!(!text.contains("verify-ca"), "{text}");
    let ok = connect(&format!(
        "{base}&sslmode=verify-ca&application_name=chain-only"
    ))
    .await;
    assert_eq!(connections(&server, "chain-only"), (1, 0));
    drop(ok);
}

/// Issue 42, case 10: `verify-ca` without `sslrootcert` would trust any
/// certificate the public roots vouch for, for any host: refused before
/// connecting, naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_without_a_root_certificate_is_refused() {
    let server = PgServer::start_tls();
    let url = format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/postgres?connect_timeout=2&sslmode=verify-ca",
        server.port()
    );
    let err = refused(&url).await;
    let text = err.to_string();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(
        text.contains("`sslmode=verify-ca` without `sslrootcert=<file>`")
            && text.contains("sslmode=verify-full"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
}

/// Against a server without TLS: `require` and `verify-full` refuse
/// clearly and in time; `prefer` (and the default) connect in the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls() {
    let server = PgServer::start();
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCerts::generate(dir.path()).unwrap();
    let base = format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/postgres?connect_timeout=2",
        server.port()
    );
    for query in [
        "sslmode=require".to_owned(),
        format!(
            "sslmode=verify-full&sslrootcert={}",
            certs.ca_cert_path().display()
        ),
    ] {
        let err = refused(&format!("{base}&{query}")).await;
        assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
        assert!(
            err.to_string().contains("server does not support TLS"),
            "{err}"
        );
    }
    // A Unix socket never has TLS: `require` is refused there too (libpq
    // would connect in the clear), `prefer` connects.
    let socket = format!(
        "postgres://postgres:hunter2@/postgres?host={}&port={}&connect_timeout=2",
        server.dir().display(),
        server.port()
    );
    let err = refused(&format!("{socket}&sslmode=require")).await;
    assert!(err.to_string().contains("Unix socket"), "{err}");
    connect(&format!("{socket}&sslmode=prefer")).await;
    for (query, app) in [("sslmode=prefer", "prefer"), ("", "default")] {
        let backend = connect(&format!("{base}&application_name={app}&{query}")).await;
        let guard = Lock::new("plain")
            .with_backend(backend)
            .acquire()
            .await
            .unwrap();
        let (tls, plain) = connections(&server, app);
        assert!(
            tls == 0 && plain >= 1,
            "{app}: encrypted {tls}, plain {plain}"
        );
        guard.release().await.unwrap();
    }
}

/// `prefer` against a server with TLS uses it (the certificate unchecked,
/// as libpq's `prefer`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_uses_tls_when_the_server_has_it() {
    let server = PgServer::start_tls();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=prefer&application_name=preferred",
        server.port()
    );
    let _backend = connect(&url).await;
    assert_eq!(connections(&server, "preferred"), (1, 0));
}

/// A `pg_hba.conf` line with `clientcert=verify-full`: the client
/// certificate (`sslcert`/`sslkey`) whose name is the user's gets in;
/// without it, the server refuses the login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates() {
    let server = PgServer::start_tls();
    let certs = server.certs().unwrap().clone();
    // The test client certificate's common name.
    server.psql(r#"CREATE ROLE "dlock test client" LOGIN SUPERUSER"#);
    server.hba_first(
        "hostssl all \"dlock test client\" 127.0.0.1/32 trust clientcert=verify-full\n\
         host all \"dlock test client\" 127.0.0.1/32 reject",
    );
    let base = format!(
        "postgres://dlock%20test%20client:hunter2@127.0.0.1:{}/postgres?connect_timeout=2&application_name=mtls&{}",
        server.port(),
        server.tls_url().split_once('?').unwrap().1
    );
    let with_cert = format!(
        "{base}&sslcert={}&sslkey={}",
        certs.client_cert_path().display(),
        certs.client_key_path().display()
    );
    let backend = connect(&with_cert).await;
    let guard = Lock::new("mtls")
        .with_backend(backend)
        .acquire()
        .await
        .unwrap();
    let dn = server.psql(
        "SELECT string_agg(DISTINCT s.client_dn, ',') FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'mtls'",
    );
    assert!(dn.contains("dlock test client"), "{dn}");
    guard.release().await.unwrap();

    let err = refused(&base).await;
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // The server's own certificate is signed by the CA too, but names
    // another subject: `verify-full` on the server's side refuses it.
    let wrong_name = format!(
        "{base}&sslcert={}&sslkey={}",
        certs.server_cert_path().display(),
        certs.server_key_path().display()
    );
    let err = refused(&wrong_name).await;
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

/// SCRAM with channel binding (`channel_binding=require`) works over TLS
/// (the server's certificate bound into the authentication), and is
/// refused without TLS; the password appears in no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_channel_binding_over_tls() {
    let server = PgServer::start_tls();
    server.psql("SET password_encryption = 'scram-sha-256'; CREATE ROLE app LOGIN SUPERUSER PASSWORD 'hunter2'");
    server.hba_first("host all app 127.0.0.1/32 scram-sha-256");
    let tls = server.tls_url().split_once('?').unwrap().1.to_owned();
    let url = format!(
        "postgres://app:hunter2@127.0.0.1:{}/postgres?connect_timeout=2&channel_binding=require",
        server.port()
    );
    let backend = connect(&format!("{url}&{tls}")).await;
    assert!(
        !backend.describe().contains("hunter2"),
        "{}",
        backend.describe()
    );
    let err = refused(&format!("{url}&sslmode=disable")).await;
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

/// Files that cannot be read or hold no certificate are `InvalidOption`
/// errors naming the parameter and the path, before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_are_invalid_options() {
    let dir = tempfile::tempdir().unwrap();
    let key_only = dir.path().join("key-only.pem");
    let certs = TestCerts::generate(dir.path()).unwrap();
    std::fs::copy(certs.client_key_path(), &key_only).unwrap();
    let missing = dir.path().join("missing.pem");
    let base = "postgres://postgres:hunter2@127.0.0.1:1/postgres?sslmode=verify-full";
    for (query, expect) in [
        (
            format!("sslrootcert={}", missing.display()),
            format!("`sslrootcert={}`: cannot read the file", missing.display()),
        ),
        (
            format!("sslrootcert={}", key_only.display()),
            format!("`sslrootcert={}`: no PEM certificate", key_only.display()),
        ),
        (
            format!(
                "sslrootcert={}&sslcert={}&sslkey={}",
                certs.ca_cert_path().display(),
                certs.client_cert_path().display(),
                certs.ca_cert_path().display()
            ),
            format!(
                "`sslkey={}`: no usable private key",
                certs.ca_cert_path().display()
            ),
        ),
        (
            format!(
                "sslrootcert={}&sslcert={}&sslkey={}",
                certs.ca_cert_path().display(),
                certs.client_cert_path().display(),
                missing.display()
            ),
            format!("`sslkey={}`: cannot read the file", missing.display()),
        ),
        (
            format!(
                "sslrootcert={}&sslcert={}&sslkey={}",
                certs.ca_cert_path().display(),
                certs.client_cert_path().display(),
                certs.server_key_path().display()
            ),
            format!(
                "`sslcert={}` and `sslkey`: not a certificate and its key",
                certs.client_cert_path().display()
            ),
        ),
    ] {
        let err = refused(&format!("{base}&{query}")).await;
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(err.to_string().contains(&expect), "{err}");
    }
}

// The conformance suite over `sslmode=verify-full`, as `rediss://` runs it
// (TLS is the transport: the read-write, semaphore, multi-key and segment
// suites send the same statements over it, and run in plain text in
// `conformance_postgres.rs`).
dlock_tests::conformance_suite!(PgFixture::tls());
