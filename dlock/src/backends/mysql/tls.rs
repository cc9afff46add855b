//! TLS to the server (`mysqls://`, `?ssl-mode=`, `?ssl-ca=`): rustls under
//! `mysql_async`, with `ring`, or the crypto provider the application
//! installed; only with the `tls` feature.
//!
//! | `ssl-mode` | what is checked of the server's certificate |
//! |---|---|
//! | `DISABLED` (the default of `mysql://`) | no TLS |
//! | `REQUIRED` | nothing: encrypted, but anyone who can intercept the connection can present any certificate |
//! | `VERIFY_CA` (needs `ssl-ca`) | the chain to `ssl-ca` |
//! | `VERIFY_IDENTITY` (the default of `mysqls://`) | the chain (to `ssl-ca`, else Mozilla's roots) and the host name |

use mysql_async::SslOpts;

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
