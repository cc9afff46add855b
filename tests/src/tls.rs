//! Throwaway TLS material for servers started with TLS (e.g. `rediss://` tests).
//!
//! Each call makes a fresh CA and, signed by it, a server certificate valid for `127.0.0.1`,
//! `::1` and `localhost`, plus a client certificate for servers that want mutual TLS. Nothing
//! is shared between tests and nothing outlives the temp dir the files are written to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::error::{Context, HarnessResult};

/// PEM files of a throwaway CA, a server certificate and a client certificate.
#[derive(Debug, Clone)]
pub struct TestCerts {
    ca_cert: PathBuf,
    ca_pem: String,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl TestCerts {
    /// Generates the CA and both leaf certificates and writes them into `dir` as
    /// `ca.crt`, `server.crt`, `server.key`, `client.crt`, `client.key`.
    pub fn generate(dir: &Path) -> HarnessResult<Self> {
        Self::generate_with(dir, None)
    }

    /// As [`TestCerts::generate`], but the server certificate names only
    /// the host `dns_name` (no address): a client that connects to
    /// `127.0.0.1` or `localhost` must refuse it (the wrong-host-name tests).
    pub fn generate_for_host(dir: &Path, dns_name: &str) -> HarnessResult<Self> {
        Self::generate_with(dir, Some(dns_name))
    }

    fn generate_with(dir: &Path, server_name: Option<&str>) -> HarnessResult<Self> {
        let mut ca_params = CertificateParams::default();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca_params.distinguished_name = name("dlock test CA");
        let ca_key = KeyPair::generate().context(|| "generate CA key".to_string())?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)
            .context(|| "self-sign CA certificate".to_string())?;

        // The server certificate is a client certificate too: servers that connect to each
        // other (Redis Cluster bus over TLS) present it as such.
        let server = leaf(
            "dlock test server",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            &ca,
            server_name,
        )?;
        let client = leaf(
            "dlock test client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &ca,
            None,
        )?;

        let certs = Self {
            ca_cert: dir.join("ca.crt"),
            ca_pem: ca.pem(),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        };
        write(&certs.ca_cert, &certs.ca_pem)?;
        write(&certs.server_cert, &server.0)?;
        write(&certs.server_key, &server.1)?;
        write(&certs.client_cert, &client.0)?;
        write(&certs.client_key, &client.1)?;
        Ok(certs)
    }

    /// Path of the CA certificate (PEM): what a client passes as its trusted root.
    pub fn ca_cert_path(&self) -> &Path {
        &self.ca_cert
    }

    /// The CA certificate itself (PEM text).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Path of the server certificate (PEM), valid for 127.0.0.1, ::1 and localhost.
    pub fn server_cert_path(&self) -> &Path {
        &self.server_cert
    }

    /// Path of the server's private key (PEM).
    pub fn server_key_path(&self) -> &Path {
        &self.server_key
    }

    /// Path of a client certificate (PEM) signed by the same CA, for mutual TLS.
    pub fn client_cert_path(&self) -> &Path {
        &self.client_cert
    }

    /// Path of the client's private key (PEM).
    pub fn client_key_path(&self) -> &Path {
        &self.client_key
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// A leaf certificate for the loopback names (or for `only` alone), signed
/// by `ca`: (cert PEM, key PEM).
fn leaf(
    common_name: &str,
    usages: Vec<ExtendedKeyUsagePurpose>,
    ca: &CertifiedIssuer<'_, KeyPair>,
    only: Option<&str>,
) -> HarnessResult<(String, String)> {
    let dns_name = only.unwrap_or("localhost").to_string();
    let mut params = CertificateParams::new(vec![dns_name])
        .context(|| format!("certificate parameters for {common_name}"))?;
    if only.is_none() {
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    }
    params.distinguished_name = name(common_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages;
    let key = KeyPair::generate().context(|| format!("generate key for {common_name}"))?;
    let cert = params
        .signed_by(&key, &**ca)
        .context(|| format!("sign certificate for {common_name}"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn write(path: &Path, pem: &str) -> HarnessResult<()> {
    std::fs::write(path, pem).context(|| format!("write {}", path.display()))
}
