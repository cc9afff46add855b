//! The `redis` crate's clients of a parsed URL: one per node, with the
//! socket options (`?tcp_keepalive=`, `?tcp_user_timeout=`) and TLS
//! (`rediss://`, `?ca=`).

use crate::backends::redis::config::RedisOptions;
use crate::LockError;

pub(in crate::backends::redis) fn client(
    options: &RedisOptions,
    node: &str,
) -> Result<redis::Client, LockError> {
    use redis::IntoConnectionInfo;
    let info = node
        .into_connection_info()
        .map_err(|e| LockError::invalid_option(format!("`{}`: {e}", options.shown)))?
        .set_tcp_settings(tcp_settings(options));
    if options.tls {
        return tls_client(options, info);
    }
    redis::Client::open(info)
        .map_err(|e| LockError::invalid_option(format!("`{}`: {e}", options.shown)))
}

/// The socket options of every connection to a server: keep-alive probes
/// and the user timeout, so that a connection whose flow died silently is
/// closed by the kernel even while no request times out on it.
pub(in crate::backends::redis) fn tcp_settings(
    options: &RedisOptions,
) -> redis::io::tcp::TcpSettings {
    let mut settings = redis::io::tcp::TcpSettings::default();
    if let Some(idle) = options.tcp_keepalive {
        let probes = redis::io::tcp::socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(idle)
            .with_retries(3);
        settings = settings.set_keepalive(probes);
    }
    if let Some(limit) = options.tcp_user_timeout {
        settings = settings.set_user_timeout(limit);
    }
    settings
}

#[cfg(feature = "tls")]
fn read_ca(options: &RedisOptions) -> Result<Option<Vec<u8>>, LockError> {
    options
        .ca_file
        .as_ref()
        .map(|path| {
            std::fs::read(path).map_err(|e| {
                LockError::invalid_option(format!(
                    "`{}`: cannot read the CA file `{path}`: {e}",
                    options.shown
                ))
            })
        })
        .transpose()
}

/// rustls needs a process-wide crypto provider and panics without one. The
/// `redis` crate picks none, so dlock installs `ring` unless the application
/// already chose a provider (which then stays in force).
#[cfg(feature = "tls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is set.
        let _ = crate::backend::tls_provider::ring().install_default();
    }
}

/// The certificates `rediss` connections trust: `?ca=`'s, or `None` for
/// the system roots. Installs the crypto provider TLS needs.
#[cfg(feature = "tls")]
pub(in crate::backends::redis) fn tls_certificates(
    options: &RedisOptions,
) -> Result<Option<redis::TlsCertificates>, LockError> {
    ensure_crypto_provider();
    Ok(read_ca(options)?.map(|root| redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root),
    }))
}

#[cfg(feature = "tls")]
fn tls_client(
    options: &RedisOptions,
    node: redis::ConnectionInfo,
) -> Result<redis::Client, LockError> {
    ensure_crypto_provider();
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: read_ca(options)?,
    };
    redis::Client::build_with_tls(node, certs)
        .map_err(|e| LockError::invalid_option(format!("`{}`: {e}", options.shown)))
}

#[cfg(not(feature = "tls"))]
fn tls_client(
    options: &RedisOptions,
    _node: redis::ConnectionInfo,
) -> Result<redis::Client, LockError> {
    Err(no_tls(options))
}

/// A TLS URL on a build without the `tls` feature.
#[cfg(not(feature = "tls"))]
fn no_tls(options: &RedisOptions) -> LockError {
    LockError::invalid_option(format!(
        "`{}` asks for TLS, but dlock was built without its `tls` feature; enable it in Cargo.toml",
        options.shown
    ))
}

#[cfg(feature = "tls")]
pub(in crate::backends::redis) fn tls_cluster(
    builder: redis::cluster::ClusterClientBuilder,
    options: &RedisOptions,
) -> Result<redis::cluster::ClusterClientBuilder, LockError> {
    ensure_crypto_provider();
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: read_ca(options)?,
    };
    Ok(builder.tls(redis::TlsMode::Secure).certs(certs))
}

#[cfg(not(feature = "tls"))]
pub(in crate::backends::redis) fn tls_cluster(
    _builder: redis::cluster::ClusterClientBuilder,
    options: &RedisOptions,
) -> Result<redis::cluster::ClusterClientBuilder, LockError> {
    Err(no_tls(options))
}
