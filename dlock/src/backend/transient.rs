//! Which failures a waiting acquisition rides through.
//!
//! A network fails for a moment more often than it fails for good: a
//! request times out on a flow a NAT forgot, a server restarts, a Sentinel
//! failover moves the master, a paused VM answers seconds late. An
//! acquisition with time left in its wait asks again after such a failure
//! (`lease/ride_through.rs`), and fails with the last error only when its
//! wait is over. What a second attempt cannot cure (a refused password, a
//! missing grant, an invalid key, a script error) fails at once.
//!
//! A failure is transient when its error, or any error in its chain of
//! sources, is one of:
//! - [`Transient`]: a backend's own word (no answer within its request
//!   timeout, a connection that failed), for errors kept as text;
//! - an I/O error of a connection (refused, reset, aborted, broken pipe,
//!   unexpected end, timed out, unreachable);
//! - a Redis error of the connection (timed out, dropped, refused) or a
//!   server's passing state (`LOADING`, `MASTERDOWN`, `TRYAGAIN`,
//!   `CLUSTERDOWN`, `READONLY` from a demoted master);
//! - an etcd transport error, or a gRPC status `UNAVAILABLE`,
//!   `DEADLINE_EXCEEDED` or `ABORTED`;
//! - [`LockError::Quorum`]: too few Redlock masters answered this round.

use std::error::Error;
use std::fmt;
use std::io;

use crate::LockError;

/// A backend failure that may pass: the server did not answer in time, or
/// the connection to it failed. Wraps the failure's own error (or text),
/// which it shows unchanged.
#[derive(Debug)]
pub(crate) struct Transient(Box<dyn Error + Send + Sync + 'static>);

impl Transient {
    // Every server backend marks its failures; the memory backend has none.
    #[cfg_attr(
        not(any(
            feature = "redis",
            feature = "etcd",
            feature = "zookeeper",
            feature = "postgres",
            feature = "mysql"
        )),
        allow(dead_code)
    )]
    /// Marks `error` as one a waiting acquisition may ride through.
    pub(crate) fn new(error: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Self {
        Transient(error.into())
    }
}

impl fmt::Display for Transient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Error for Transient {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

/// Whether `error` may pass if asked again (see the module docs).
pub(crate) fn is_transient(error: &LockError) -> bool {
    match error {
        LockError::Quorum { .. } => true,
        LockError::Backend { source, .. } => is_transient_error(&**source),
        _ => false,
    }
}

/// Whether `error`, or an error in its chain of sources, may pass.
pub(crate) fn is_transient_error(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if is_transient_cause(e) {
            return true;
        }
        next = e.source();
    }
    false
}

/// One error of a chain, on its own.
fn is_transient_cause(e: &(dyn Error + 'static)) -> bool {
    if e.is::<Transient>() {
        return true;
    }
    if let Some(io) = e.downcast_ref::<io::Error>() {
        return is_transient_io(io.kind());
    }
    #[cfg(feature = "redis")]
    if let Some(redis) = e.downcast_ref::<redis::RedisError>() {
        return is_transient_redis(redis);
    }
    #[cfg(feature = "etcd")]
    if let Some(etcd) = e.downcast_ref::<etcd_client::Error>() {
        return is_transient_etcd(etcd);
    }
    false
}

fn is_transient_io(kind: io::ErrorKind) -> bool {
    use io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | BrokenPipe
            | TimedOut
            | UnexpectedEof
            | WouldBlock
            | Interrupted
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
            | AddrNotAvailable
    )
}

#[cfg(feature = "redis")]
fn is_transient_redis(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    if e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    match e.kind() {
        // Every node's connection lost at once (reset): the Cluster
        // connection is opened anew from the URL's nodes (`cluster.rs`).
        ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Server(kind) => matches!(
            kind,
            ServerErrorKind::BusyLoading
                | ServerErrorKind::MasterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::ReadOnly
        ),
        _ => false,
    }
}

#[cfg(feature = "etcd")]
fn is_transient_etcd(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::IoError(io) => is_transient_io(io.kind()),
        etcd_client::Error::GRpcStatus(status) => matches!(
            i32::from(status.code()),
            // UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED
            14 | 4 | 10
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(source: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> LockError {
        LockError::backend("test://", source)
    }

    #[test]
    fn connection_failures_and_no_answers_are_transient() {
        assert!(is_transient(&backend(io::Error::from(
            io::ErrorKind::ConnectionReset
        ))));
        assert!(is_transient(&backend(Transient::new(
            "the server did not answer within 5s"
        ))));
        assert!(is_transient(&LockError::Quorum {
            reached: 1,
            needed: 2
        }));
    }

    #[test]
    fn refusals_and_bad_input_are_not() {
        assert!(!is_transient(&backend("NOPERM no permissions")));
        assert!(!is_transient(&backend(io::Error::from(
            io::ErrorKind::PermissionDenied
        ))));
        assert!(!is_transient(&LockError::invalid_option("bad")));
        assert!(!is_transient(&LockError::Busy { key: "k".into() }));
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_timeouts_and_passing_server_states_are_transient() {
        let timed_out: redis::RedisError = io::Error::from(io::ErrorKind::TimedOut).into();
        assert!(is_transient(&backend(timed_out)));
        let loading = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
            "LOADING",
        ));
        assert!(is_transient(&backend(loading)));
        let no_node = redis::RedisError::from((
            redis::ErrorKind::ClusterConnectionNotFound,
            "No connections found",
        ));
        assert!(is_transient(&backend(no_node)));
        let noperm = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "NOPERM",
        ));
        assert!(!is_transient(&backend(noperm)));
    }
}
