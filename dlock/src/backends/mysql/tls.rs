//! TLS to the server (`mysqls://`, `?ssl-mode=`, `?ssl-ca=`): rustls under
//! `mysql_async`, with `ring`, or the crypto provider the application
//! installed; only with the `tls` feature.
//!
//! | `ssl-mode` | what is checked of the server's certificate |
//! |---|---|
//! | `DISABLED` (the default of `mysql://`) | no TLS |
//! | `REQUIRED` | nothing: encrypted, but anyone who can intercept the connection can present any certificate |
//! | `VERIFY_CA` (needs `ssl-ca`) | the chain to `ssl-ca`, and today the host name too (below) |
//! | `VERIFY_IDENTITY` (the default of `mysqls://`) | the chain (to `ssl-ca`, else Mozilla's roots) and the host name |

//!
//! `VERIFY_CA` asks `mysql_async` to skip the host name
//! (`with_danger_skip_domain_validation`), but its rustls path recognises a
//! name mismatch by an error text rustls 0.23 no longer writes
//! (blackbeam/mysql_async#404, fixed upstream by #408, not released in
//! 0.37.1): so `VERIFY_CA` refuses a certificate that does not name the
//! URL's host, as `VERIFY_IDENTITY` does. Stricter, never weaker; the test
//! `a_certificate_for_another_host_is_refused_by_verify_identity` pins it.

use mysql_async::SslOpts;

use super::Failure;

/// `?ssl-mode=`, with the names of MySQL's own client (`--ssl-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SslMode {
    /// Plain connections only (the default of `mysql://`).
    Disabled,
    /// TLS or no connection; the certificate is not checked.
    Required,
    /// TLS, the certificate's chain checked (to `?ssl-ca=`).
    VerifyCa,
    /// TLS, the chain and the host name checked (the default of `mysqls://`).
    VerifyIdentity,
}

impl SslMode {
    pub(super) fn parse(value: &str) -> Option<Self> {
        Some(match value.to_ascii_uppercase().as_str() {
            "DISABLED" => SslMode::Disabled,
            "REQUIRED" => SslMode::Required,
            "VERIFY_CA" => SslMode::VerifyCa,
            "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
            _ => return None,
        })
    }
}

/// The client's TLS options for `mode` and the CA file `ca`; `None` for
/// plain connections. The file must be readable (checked here, so a wrong
/// path is an error of `connect` that names it).
pub(super) fn ssl_opts(
    mode: SslMode,
    ca: Option<std::path::PathBuf>,
) -> Result<Option<SslOpts>, String> {
    if mode == SslMode::Disabled {
        return Ok(None);
    }
    if !cfg!(feature = "tls") {
        return Err(
            "TLS (`mysqls://` or `ssl-mode=` other than DISABLED) needs dlock's `tls` cargo feature: features = [\"mysql\", \"tls\"]".into(),
        );
    }
    #[cfg(feature = "tls")]
    ensure_crypto_provider();
    let mut opts = SslOpts::default();
    if let Some(ca) = ca {
        let pem = std::fs::read(&ca)
            .map_err(|e| format!("`ssl-ca={}` cannot be read: {e}", ca.display()))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!(
                "`ssl-ca={}` holds no PEM certificate",
                ca.display()
            ));
        }
        opts = opts
            .with_root_certs(vec![ca.into()])
            .with_disable_built_in_roots(true);
    }
    Ok(Some(match mode {
        SslMode::Disabled => return Ok(None),
        SslMode::Required => opts.with_danger_accept_invalid_certs(true),
        SslMode::VerifyCa => opts.with_danger_skip_domain_validation(true),
        SslMode::VerifyIdentity => opts,
    }))
}

/// rustls needs a process-wide crypto provider, and `mysql_async` builds
/// its configuration with the default one; with more than one provider
/// compiled in (`ring` for dlock, `aws-lc-rs` through another crate's
/// rustls features) there is no default until one is installed, and the
/// first TLS connection would panic. dlock installs `ring` unless the
/// application already chose a provider (which then stays in force), as
/// the Redis and ZooKeeper backends do.
#[cfg(feature = "tls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is set.
        let _ = crate::backend::tls_provider::ring().install_default();
    }
}

/// A failed connect, with what to do when TLS is why: a certificate the
/// client refused (a wrong `ssl-ca=`, a host name the certificate does not
/// name) or a server that offers no TLS to a client that requires it.
/// Neither passes by trying again.
pub(super) fn explained(failure: Failure) -> Failure {
    let text = &failure.text;
    let hint = if text.contains("invalid peer certificate") {
        "the server's TLS certificate was refused: `ssl-ca=` must name the CA that signed it, \
         and the certificate must name the URL's host (under VERIFY_IDENTITY, the default of \
         `mysqls://`, and with this client under VERIFY_CA too)"
    } else if text.contains("server does not have this capability") {
        "the server offers no TLS, and this URL requires it (`mysqls://` or an `ssl-mode=` \
         other than DISABLED; dlock never falls back to plain text): turn TLS on in the \
         server (`ssl_cert`, `ssl_key`), or use `ssl-mode=DISABLED` on a trusted network"
    } else {
        return failure;
    };
    Failure {
        text: format!("{hint} ({text})"),
        transient: false,
        broken: true,
    }
}
