//! The one error type of the harness.
//!
//! Harness failures are set-up failures (a binary is missing, a port is taken, a server did
//! not become ready), never the subject of a test, so a single type that carries a readable
//! message (with the server's log tail where there is one) is all a test needs to print.

use std::fmt;

/// Why the harness could not start, probe or control a server.
///
/// The message is meant for a person reading a failed test: it names what was attempted,
/// and, for a missing binary, the command that installs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarnessError {
    message: String,
}

impl HarnessError {
    /// Makes an error from a complete, human-readable message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The message, as `Display` prints it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HarnessError {}

/// Result alias used throughout the harness.
pub type HarnessResult<T> = Result<T, HarnessError>;

/// Adds context to I/O (or any displayable) errors.
pub(crate) trait Context<T> {
    /// Wraps the error into a [`HarnessError`] whose message starts with `what`.
    fn context(self, what: impl FnOnce() -> String) -> HarnessResult<T>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> HarnessResult<T> {
        self.map_err(|e| HarnessError::new(format!("{}: {e}", what())))
    }
}
