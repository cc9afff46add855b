//! The one error type of dlock.

use std::time::Duration;

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// Variants are named after the outcome. A transport or protocol failure is
/// always [`LockError::Backend`] and never "not acquired": a caller must be
/// able to tell "someone else holds it" from "the service did not answer".
///
/// # Example
///
/// ```
/// use dlock::{Lock, LockError};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let backend = dlock::connect("memory://").await.unwrap();
/// let lock = Lock::new("report").with_backend(backend).wait(Duration::ZERO);
/// let _held = lock.acquire().await.unwrap();
/// let second = tokio::spawn(async move { lock.acquire().await }).await.unwrap();
/// assert!(matches!(second, Err(LockError::Busy { ref key }) if key == "report"));
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The wait was zero and another owner holds the lock.
    #[error("lock `{key}` is held by another owner (wait was zero, so no waiting was done)")]
    Busy {
        /// The lock key.
        key: String,
    },
    /// The lock was not free within the configured wait.
    #[error("lock `{key}` was not acquired within {waited:?}; raise `wait` or find the holder")]
    Timeout {
        /// The lock key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lease was lost while it was held: renewal was refused, or the
    /// service was unreachable until the lease could have expired.
    #[error("lease on lock `{key}` was lost: another owner may hold it now, so the critical section was not protected to its end")]
    Lost {
        /// The lock key.
        key: String,
    },
    /// A release found that the lease was no longer held (it expired or was lost).
    #[error(
        "lock `{key}` is not held by this guard any more (it expired or was lost before release)"
    )]
    NotHeld {
        /// The lock key.
        key: String,
    },
    /// No backend is registered under this name (or no default is set).
    #[error("no lock backend named `{name}` is registered (registered: {}); register one with `dlock::registry().register(name, dlock::connect(url).await?)` or set a default with `set_default`", list_or_none(registered))]
    NoBackend {
        /// The name asked for (`"default"` for the default backend).
        name: String,
        /// The names that are registered, to say what could have been meant.
        registered: Vec<String>,
    },
    /// The key is not a valid lock key.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The rejected key (shown escaped, since it may hold control characters).
        key: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// An option or URL is unusable.
    #[error("invalid option: {reason}")]
    InvalidOption {
        /// What is wrong and what to do.
        reason: String,
    },
    /// Fewer Redlock masters answered than a quorum needs.
    #[error("only {reached} of the {needed} masters needed for a quorum answered")]
    Quorum {
        /// How many masters answered.
        reached: usize,
        /// How many masters a quorum needs.
        needed: usize,
    },
    /// Redis: fewer replicas than asked (`?replicas=`) acknowledged the write
    /// that granted the lease within `?replica_timeout=`. The grant was
    /// undone: a failover could have lost it.
    #[error("lock `{key}`: only {acknowledged} of the {needed} replicas asked for acknowledged the grant in time, so it was given back (a failover could have lost it); check the replicas' links, or lower `replicas` / raise `replica_timeout` in the URL")]
    Replication {
        /// The lock key.
        key: String,
        /// How many replicas acknowledged.
        acknowledged: u32,
        /// How many were asked for.
        needed: u32,
    },
    /// [`dlock::shutdown`](crate::shutdown) ran in this process: its
    /// leases were given back and its background runtime stopped, so no
    /// lease can be taken, and no lock inspected, listed or connected to,
    /// any more.
    #[error("dlock was shut down in this process (`dlock::shutdown()` ran): locks can no longer be taken, inspected or connected to here; call `dlock::shutdown()` only once the work that needs locks is done, as the last step before exit")]
    ShutDown,
    /// The coordination service failed: connection, protocol or server error.
    #[error("{backend} backend failed: {source}")]
    Backend {
        /// Which backend, with its address (credentials redacted).
        backend: String,
        /// The underlying error, with the server's own message kept.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl LockError {
    /// Wraps a backend failure, keeping the original error as the source.
    pub fn backend(
        backend: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        LockError::Backend {
            backend: backend.into(),
            source: source.into(),
        }
    }

    /// Builds an [`LockError::InvalidOption`] from a message.
    pub fn invalid_option(reason: impl Into<String>) -> Self {
        LockError::InvalidOption {
            reason: reason.into(),
        }
    }
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}
