//! The rustls crypto provider dlock installs when the application installed
//! none (the Redis, ZooKeeper and MySQL backends install it process-wide;
//! PostgreSQL's TLS uses it without installing).

/// rustls's *ring* provider.
///
/// rustls 0.23.48 deprecates `rustls::crypto::ring::default_provider`
/// ("no support for post-quantum algorithms": ring has no hybrid
/// post-quantum key exchange). Its non-deprecated replacement, aws-lc-rs,
/// needs a C compiler and cmake to build, which dlock does not impose: it
/// keeps ring, in this one place, without the warning in builds against
/// newer rustls. An application that wants post-quantum key exchange
/// installs the aws-lc-rs provider itself
/// (`CryptoProvider::install_default`) before it connects: dlock then uses
/// that one.
#[allow(deprecated)]
pub(crate) fn ring() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}
