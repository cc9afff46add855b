//! TLS to PostgreSQL (features `postgres` and `tls`): the rustls client
//! configuration of a URL's `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey`, built once at `connect` and shared by every connection of the
//! backend (each lock session and the `LISTEN` connection).
//!
//! What each mode checks of the server's certificate, as libpq does:
//!
//! | `sslmode` | without `sslrootcert` | with `sslrootcert` |
//! |---|---|---|
//! | `prefer`, `require` | nothing but the handshake's signature | the chain |
//! | `verify-ca` | refused (`config.rs`): public roots vouch for names, not for a chain alone | the chain |
//! | `verify-full` | the chain and the host name, to Mozilla's roots | the chain and the host name |
//!
//! "Nothing but the handshake's signature": the server proves it holds the
//! key of the certificate it sent, but any certificate is accepted, so an
//! active attacker in the middle goes unnoticed (libpq's `require`).
//! `verify-full` is the mode to use.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls_params::{Root, SslMode, TlsParams};
use crate::LockError;

/// The connector every connection of the backend uses.
pub(super) type Connector = MakeRustlsConnect;

/// The connector of `params`; `shown` is the redacted URL, for errors.
///
/// # Errors
/// [`LockError::InvalidOption`] naming the parameter and the path of a file
/// that cannot be read or holds no usable PEM.
pub(super) fn connector(params: &TlsParams, shown: &str) -> Result<Connector, LockError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| LockError::invalid_option(format!("`{shown}`: TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (params.mode, &params.root) {
        // No TLS (`parse` refuses files with it), or TLS that checks no
        // certificate (libpq's `prefer` and `require` without a root
        // certificate).
        (SslMode::Disable, _) | (SslMode::Prefer | SslMode::Require, None) => {
            Arc::new(WithoutHostName {
                roots: None,
                provider: provider.clone(),
            })
        }
        (mode, root) => {
            let roots = Arc::new(roots(root.as_ref(), shown)?);
            // Built for `verify-ca` too: it refuses roots it cannot use.
            let full = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| {
                    LockError::invalid_option(format!("`{shown}`: TLS: the root certificates: {e}"))
                })?;
            if mode == SslMode::VerifyFull {
                full
            } else {
                Arc::new(WithoutHostName {
                    roots: Some(roots),
                    provider: provider.clone(),
                })
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match &params.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = certificates("sslcert", cert, shown)?;
            let key_pem = std::fs::read(key).map_err(|e| {
                LockError::invalid_option(format!(
                    "`{shown}`: `sslkey={}`: cannot read the file: {e}",
                    key.display()
                ))
            })?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                LockError::invalid_option(format!(
                    "`{shown}`: `sslkey={}`: no usable private key (an unencrypted PEM key: PKCS#8, PKCS#1 or SEC1): {e}",
                    key.display()
                ))
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                LockError::invalid_option(format!(
                    "`{shown}`: `sslcert={}` and `sslkey`: not a certificate and its key: {e}",
                    cert.display()
                ))
            })?
        }
    };
    // What libpq 17 offers; servers before 17 ignore it, 17 and later
    // require it for `sslnegotiation=direct`.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(MakeRustlsConnect::new(config))
}

/// The crypto provider the application installed, else `ring` (dlock's
/// own; not installed process-wide, so the application's later choice is
/// not taken from it).
fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(crate::backend::tls_provider::ring()))
}

/// The trusted roots: `sslrootcert`'s certificates, or Mozilla's.
fn roots(root: Option<&Root>, shown: &str) -> Result<RootCertStore, LockError> {
    match root {
        None | Some(Root::System) => Ok(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        }),
        Some(Root::File(path)) => {
            let mut store = RootCertStore::empty();
            for cert in certificates("sslrootcert", path, shown)? {
                store.add(cert).map_err(|e| {
                    LockError::invalid_option(format!(
                        "`{shown}`: `sslrootcert={}`: not a usable CA certificate: {e}",
                        path.display()
                    ))
                })?;
            }
            Ok(store)
        }
    }
}

/// The PEM certificates of the file `path` (the parameter `name`'s); at
/// least one.
fn certificates(
    name: &str,
    path: &Path,
    shown: &str,
) -> Result<Vec<CertificateDer<'static>>, LockError> {
    let bad = |why: String| {
        LockError::invalid_option(format!("`{shown}`: `{name}={}`: {why}", path.display()))
    };
    // Read first: a missing file is "cannot read", not "no certificate".
    let pem = std::fs::read(path).map_err(|e| bad(format!("cannot read the file: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(
            "no PEM certificate (`-----BEGIN CERTIFICATE-----`) in the file".into(),
        ));
    }
    Ok(certs)
}

/// What every mode but `verify-full` checks of the server's certificate:
/// with `roots`, the chain to one of them, validity dates and key usage,
/// but not the host name (`verify-ca`, and `prefer`/`require` with a root
/// certificate); without, nothing: any certificate is accepted (libpq's
/// `prefer` and `require` without a root certificate). Either way the
/// server must sign the handshake with the key of the certificate it sent,
/// checked as [`WebPkiServerVerifier`] checks it.
#[derive(Debug)]
struct WithoutHostName {
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for WithoutHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
