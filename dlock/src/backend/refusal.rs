//! A server's refusal (an ACL or a role without the grant) explained: which
//! lock it was, and what the credentials need, with the server's own error
//! kept as the source.

use std::error::Error;
use std::fmt;

use crate::LockError;

/// What a refused request was about: a lock, read-write lock, semaphore
/// or election, by its key or name.
#[derive(Clone, Copy)]
pub(crate) enum About<'a> {
    Lock(&'a str),
    Rw(&'a str),
    Semaphore(&'a str),
    // Only etcd names an election's own key range; Redis and the rest
    // refuse an election as the lock of its name.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Election(&'a str),
}

impl<'a> About<'a> {
    /// What it is, as a message says it.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            About::Lock(_) => "lock",
            About::Rw(_) => "read-write lock",
            About::Semaphore(_) => "semaphore",
            About::Election(_) => "election",
        }
    }

    /// Its key or name.
    pub(crate) fn name(self) -> &'a str {
        match self {
            About::Lock(name)
            | About::Rw(name)
            | About::Semaphore(name)
            | About::Election(name) => name,
        }
    }
}

/// Where the grants a refusal names are described.
pub(crate) const SEE_PERMISSIONS: &str = "see Permissions in dlock::guide::backends";

/// The refusal of a request about one lock, semaphore or read-write lock.
#[derive(Debug)]
struct Refusal {
    /// What was refused and the grant that is missing.
    what: String,
    /// The server's own error.
    source: Box<dyn Error + Send + Sync + 'static>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (the server said: {})", self.what, self.source)
    }
}

impl Error for Refusal {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

/// `error` with `what` (the key and the missing grant) in front of the
/// server's message, if it is a [`LockError::Backend`] for which `refused`
/// holds; any other error as it is.
pub(crate) fn explain(
    error: LockError,
    refused: impl Fn(&(dyn Error + 'static)) -> bool,
    what: impl FnOnce() -> String,
) -> LockError {
    match error {
        LockError::Backend { backend, source } if refused(&*source) => LockError::Backend {
            backend,
            source: Box::new(Refusal {
                what: what(),
                source,
            }),
        },
        other => other,
    }
}

/// Whether `error` or one of its sources says `needle`.
pub(crate) fn says(error: &(dyn Error + 'static), needle: &str) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.to_string().contains(needle) {
            return true;
        }
        next = e.source();
    }
    false
}
