//! The accessors every server harness shares, written once: a single
//! server's port, address, temp dir and TLS files, and a group's members by
//! index.

/// `port()`, `addr()` and `dir()` of a single server whose client port is
/// the field `$port` and whose temp dir is the field `dir`; with `certs`,
/// also `certs()` and `ca_cert_path()` from the field `certs`.
macro_rules! single_server_accessors {
    ($port:ident) => {
        /// The client port (the TLS port of a TLS server).
        pub fn port(&self) -> u16 {
            self.$port
        }

        /// The client address, `127.0.0.1:PORT`.
        pub fn addr(&self) -> std::net::SocketAddr {
            std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, self.$port))
        }

        /// The server's temp dir (its configuration, data and log).
        pub fn dir(&self) -> &std::path::Path {
            self.dir.path()
        }
    };
    ($port:ident, certs) => {
        $crate::servers::accessors::single_server_accessors!($port);

        /// The CA certificate (PEM file) that signed a TLS server's certificate.
        pub fn ca_cert_path(&self) -> Option<&std::path::Path> {
            self.certs
                .as_ref()
                .map($crate::tls::TestCerts::ca_cert_path)
        }

        /// All TLS files of a TLS server (CA, server and client certificates).
        pub fn certs(&self) -> Option<&$crate::tls::TestCerts> {
            self.certs.as_ref()
        }
    };
}

/// A group's members in the field `$field` (a `Vec<$server>`): `$one(i)`,
/// `$one_mut(i)` (to kill, pause or restart one), `$all()`, `len()` and
/// `is_empty()`.
macro_rules! member_accessors {
    ($field:ident: $server:ty, $one:ident, $one_mut:ident, $all:ident) => {
        /// Member `i` (0-based, in start order).
        pub fn $one(&self, i: usize) -> &$server {
            &self.$field[i]
        }

        /// Member `i`, to kill, pause or restart it.
        pub fn $one_mut(&mut self, i: usize) -> &mut $server {
            &mut self.$field[i]
        }

        /// All members, in start order.
        pub fn $all(&self) -> &[$server] {
            &self.$field
        }

        /// The number of members.
        pub fn len(&self) -> usize {
            self.$field.len()
        }

        /// Whether the group has no member (never true once started).
        pub fn is_empty(&self) -> bool {
            self.$field.is_empty()
        }
    };
}

pub(crate) use {member_accessors, single_server_accessors};
