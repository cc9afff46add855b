//! The TLS part of a PostgreSQL URL as dlock reads it (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`): what `config.rs` parses and
//! `tls.rs` (feature `tls`) builds the client configuration of. A file of
//! its own so that both stand on it, the parser above the connector.

use std::path::PathBuf;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SslMode {
    /// Plain connections only.
    Disable,
    /// TLS if the server offers it, else plain (libpq's default; `allow`
    /// is read as this too).
    Prefer,
    /// TLS or no connection; the chain checked only with `sslrootcert`.
    Require,
    /// TLS, the server's certificate chain checked.
    VerifyCa,
    /// TLS, the chain and the host name checked.
    VerifyFull,
}

impl SslMode {
    pub(super) fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether to ask for TLS, and whether to
    /// go on without it (the certificate checks are the TLS configuration's).
    pub(super) fn wire(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Wire;
        match self {
            SslMode::Disable => Wire::Disable,
            SslMode::Prefer => Wire::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Wire::Require,
        }
    }
}

/// `sslrootcert`: the CA certificates to trust.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Root {
    /// `sslrootcert=system`: the roots dlock trusts by default (Mozilla's).
    System,
    /// A PEM file of CA certificates.
    File(PathBuf),
}

/// The TLS part of a URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TlsParams {
    pub(super) mode: SslMode,
    pub(super) root: Option<Root>,
    /// `sslcert` and `sslkey`: the client certificate (PEM) and its key.
    pub(super) identity: Option<(PathBuf, PathBuf)>,
}
