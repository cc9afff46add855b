//! A server's refusal (an ACL or a role without the grant) explained: which
//! lock it was, and what the credentials need, with the server's own error
//! kept as the source.

use std::error::Error;
use std::fmt;

use crate::LockError;

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
