//! `LockError` as an HTTP response (feature `axum`), so an axum handler
//! can return `Result<_, LockError>`, or an error type of its own built
//! `From` it that hands the response on.

use axum_core::response::{IntoResponse, Response};
use http::header::{HeaderValue, RETRY_AFTER};
use http::StatusCode;

use crate::LockError;

mod http_error;
pub use http_error::HttpError;

/// The `Retry-After` of a lock another caller holds, in seconds: the
/// holder of a request-sized critical section is usually done by then.
const RETRY_AFTER_SECS: &str = "1";

impl LockError {
    /// The HTTP status this error answers with ([`IntoResponse`], feature
    /// `axum`):
    ///
    /// | error | status | why |
    /// |---|---|---|
    /// | `Busy`, `Timeout` | 409 Conflict, `Retry-After: 1` | another request holds the resource; retrying later is right |
    /// | `Lost`, `NotHeld` | 409 Conflict | the work ran without the lock to its end: the client should check the outcome before retrying |
    /// | `Backend`, `Quorum`, `Replication` | 503 Service Unavailable | the lock service failed: an outage, worth an alert |
    /// | `NoBackend`, `InvalidKey`, `InvalidOption` | 500 Internal Server Error | a bug or a misconfiguration of the service |
    ///
    /// ```
    /// use dlock::LockError;
    /// use http::StatusCode;
    ///
    /// let busy = LockError::Busy { key: "order:7".into() };
    /// assert_eq!(busy.status(), StatusCode::CONFLICT);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            LockError::Busy { .. }
            | LockError::Timeout { .. }
            | LockError::Lost { .. }
            | LockError::NotHeld { .. } => StatusCode::CONFLICT,
            LockError::Backend { .. }
            | LockError::Quorum { .. }
            | LockError::Replication { .. }
            | LockError::ShutDown => StatusCode::SERVICE_UNAVAILABLE,
            LockError::NoBackend { .. }
            | LockError::InvalidKey { .. }
            | LockError::InvalidOption { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What the client reads: a short fixed text. The error itself names
    /// keys and server addresses, which are the service's business; it
    /// goes to the service's log instead (a `tracing` event at WARN for a
    /// 5xx, DEBUG for a 409).
    fn public_text(&self) -> &'static str {
        match self {
            LockError::Busy { .. } | LockError::Timeout { .. } => {
                "the resource is in use by another request; retry later"
            }
            LockError::Lost { .. } | LockError::NotHeld { .. } => {
                "the resource's lock was lost during the request; check the outcome before retrying"
            }
            LockError::Backend { .. }
            | LockError::Quorum { .. }
            | LockError::Replication { .. } => "the lock service is unavailable",
            LockError::ShutDown => "the service is shutting down",
            LockError::NoBackend { .. }
            | LockError::InvalidKey { .. }
            | LockError::InvalidOption { .. } => "internal error",
        }
    }
}

/// Answers with [`LockError::status`] and a short plain-text body; `Busy`
/// and `Timeout` add `Retry-After: 1`.
///
/// ```
/// use axum_core::response::IntoResponse;
/// use dlock::LockError;
///
/// let response = LockError::Timeout {
///     key: "order:7".into(),
///     waited: std::time::Duration::from_millis(50),
/// }
/// .into_response();
/// assert_eq!(response.status(), 409);
/// assert_eq!(response.headers()["retry-after"], "1");
/// ```
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, status = status.as_u16(), "lock error answered");
        } else {
            tracing::debug!(error = %self, status = status.as_u16(), "lock error answered");
        }
        let retry = matches!(self, LockError::Busy { .. } | LockError::Timeout { .. });
        answer(status, self.public_text(), retry)
    }
}

/// The response to an error: its status, its text, and `Retry-After` when trying again soon
/// may succeed (a busy key, a wait that ran out).
/// A handler (or a `#[distributed_lock]` function) that answers a bare
/// `StatusCode` as its error gets the lock error's status: `?` on a
/// `LockError`, and a lock the attribute could not take, answer 409 for
/// contention and 503 for an outage. The error's text is logged, not sent:
/// return [`HttpError`] to send it too.
///
/// ```
/// use dlock::LockError;
/// use http::StatusCode;
///
/// let outage = LockError::backend("redis://cache:6379", "connection refused");
/// assert_eq!(StatusCode::from(outage), StatusCode::SERVICE_UNAVAILABLE);
/// ```
impl From<LockError> for StatusCode {
    fn from(error: LockError) -> StatusCode {
        let status = error.status();
        if status.is_server_error() {
            tracing::warn!(error = %error, status = status.as_u16(), "lock error answered");
        } else {
            tracing::debug!(error = %error, status = status.as_u16(), "lock error answered");
        }
        status
    }
}

fn answer(status: StatusCode, text: impl IntoResponse, retry_after: bool) -> Response {
    let mut response = (status, text).into_response();
    if retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
    }
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn answer(error: LockError) -> (u16, Option<String>) {
        let response = error.into_response();
        let retry = response
            .headers()
            .get(RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        (response.status().as_u16(), retry)
    }

    #[test]
    fn each_error_has_its_status() {
        let key = || "order:7".to_owned();
        let one = Some("1".to_owned());
        assert_eq!(answer(LockError::Busy { key: key() }), (409, one.clone()));
        let waited = Duration::from_millis(50);
        assert_eq!(
            answer(LockError::Timeout { key: key(), waited }),
            (409, one)
        );
        assert_eq!(answer(LockError::Lost { key: key() }), (409, None));
        assert_eq!(answer(LockError::NotHeld { key: key() }), (409, None));
        assert_eq!(answer(LockError::backend("redis://h", "down")), (503, None));
        let quorum = LockError::Quorum {
            reached: 1,
            needed: 2,
        };
        assert_eq!(answer(quorum), (503, None));
        let replication = LockError::Replication {
            key: key(),
            acknowledged: 0,
            needed: 1,
        };
        assert_eq!(answer(replication), (503, None));
        let no_backend = LockError::NoBackend {
            name: "etcd".into(),
            registered: vec![],
        };
        assert_eq!(answer(no_backend), (500, None));
        let invalid_key = LockError::InvalidKey {
            key: String::new(),
            reason: "empty".into(),
        };
        assert_eq!(answer(invalid_key), (500, None));
        assert_eq!(answer(LockError::invalid_option("ttl")), (500, None));
    }

    #[test]
    fn the_body_does_not_show_keys_or_servers() {
        let response = LockError::backend("redis://secret-host:6379", "down").into_response();
        assert_eq!(response.status(), 503);
        let response = LockError::Busy {
            key: "order:7".into(),
        }
        .into_response();
        assert_eq!(
            response.headers()["content-type"],
            "text/plain; charset=utf-8"
        );
    }
}
