//! TLS for `zks://` (feature `tls`): the CA and the optional client
//! certificate of the URL, read once at `connect`, as `zookeeper-client`'s
//! `TlsOptions`. The client checks each server's certificate against the
//! CA and the host name it connects to.

use zookeeper_client::TlsOptions;

use super::config::TlsFiles;
use crate::LockError;

/// The TLS options of `files`: the CA, and the client certificate if any.
///
/// # Errors
/// [`LockError::InvalidOption`] naming the file that cannot be read or is
/// not PEM (never the URL's password: `shown` is redacted).
pub(super) fn options(files: &TlsFiles, shown: &str) -> Result<TlsOptions, LockError> {
    ensure_crypto_provider();
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|e| {
            LockError::invalid_option(format!(
                "`{shown}`: cannot read the {what} file `{}`: {e}",
                path.display()
            ))
        })
    };
    let unusable = |what: &str, path: &std::path::Path, e: zookeeper_client::Error| {
        LockError::invalid_option(format!(
            "`{shown}`: the {what} file `{}` is not usable PEM: {e}",
            path.display()
        ))
    };
    let ca = read("CA", &files.ca)?;
    let mut options = TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(|e| unusable("CA", &files.ca, e))?;
    if let Some((cert_path, key_path)) = &files.identity {
        let cert = read("client certificate", cert_path)?;
        let key = read("client key", key_path)?;
        options = options
            .with_pem_identity(&cert, &key)
            .map_err(|e| unusable("client certificate or key", cert_path, e))?;
    }
    Ok(options)
}

/// rustls needs a process-wide crypto provider, and `zookeeper-client`
/// builds its configuration with the default one; with more than one
/// provider compiled in (`ring` for dlock, `aws-lc-rs` through
/// `zookeeper-client`'s own rustls features) there is no default until one
/// is installed. dlock installs `ring` unless the application already chose
/// a provider (which then stays in force), as the Redis backend does.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is set.
        let _ = crate::backend::tls_provider::ring().install_default();
    }
}
