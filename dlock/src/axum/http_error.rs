//! [`HttpError`]: a handler's whole error type, ready to answer; `?` turns
//! a lock error and any other error into it.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;

use axum_core::response::{IntoResponse, Response};
use http::StatusCode;

use crate::LockError;

type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// An axum handler's error, ready to answer (feature `axum`): return
/// `Result<T, HttpError>` and `?` converts whatever fails.
///
/// - A [`LockError`] (or any error with one in its
///   [`source`](Error::source) chain, such as an application's own enum
///   with a `Lock(#[from] LockError)` variant) answers as the `LockError`
///   does: [`LockError::status`], a short text, `Retry-After` on `Busy` and
///   `Timeout`.
/// - Any other error (the database's, the HTTP client's) answers 500
///   `internal error`; the error itself, with its chain, goes to the log
///   (a WARN event "error answered"), never to the client.
/// - [`HttpError::new`] answers with a status and text of your choosing
///   (`404 no such order`).
///
/// It is not itself a [`std::error::Error`] (as `anyhow::Error` is not):
/// that is what lets every error convert into it with `?`.
///
/// ```
/// use axum_core::response::IntoResponse;
/// use dlock::{distributed_lock, HttpError, LockGuard};
///
/// #[distributed_lock(key = "order:{id}", wait = "0s")]
/// async fn pay(id: u64, guard: &LockGuard) -> Result<String, HttpError> {
///     let amount: u64 = "12".parse()?; // any error converts with `?`
///     if id == 0 {
///         return Err(HttpError::new(http::StatusCode::NOT_FOUND, "no such order"));
///     }
///     Ok(format!("paid {amount} with fence {:?}", guard.fencing_token()))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// assert_eq!(pay(0).await.unwrap_err().into_response().status(), 404);
/// let held = dlock::Lock::new("order:7").acquire().await?;
/// let busy = pay(7).await.unwrap_err().into_response();
/// assert_eq!(busy.status(), http::StatusCode::CONFLICT);
/// assert_eq!(busy.headers()["retry-after"], "1");
/// let bad: HttpError = "x".parse::<u64>().unwrap_err().into();
/// assert_eq!(bad.status(), 500);
/// # drop(held); Ok(()) }
/// ```
///
/// An application that keeps its own error enum hands it on in one line:
///
/// ```
/// use axum_core::response::{IntoResponse, Response};
///
/// #[derive(Debug)]
/// enum AppError {
///     Lock(dlock::LockError),
/// }
/// # impl std::fmt::Display for AppError {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("lock failed") }
/// # }
/// impl std::error::Error for AppError {
///     // The `LockError` must be in the source chain (thiserror: `#[error("..")]`
///     // with `#[from]`, not `#[error(transparent)]`, which skips it).
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         match self { AppError::Lock(e) => Some(e) }
///     }
/// }
///
/// impl IntoResponse for AppError {
///     fn into_response(self) -> Response {
///         dlock::HttpError::from(self).into_response()
///     }
/// }
///
/// let busy = AppError::Lock(dlock::LockError::Busy { key: "order:7".into() });
/// assert_eq!(busy.into_response().status(), 409);
/// ```
pub struct HttpError {
    status: StatusCode,
    text: Cow<'static, str>,
    retry_after: bool,
    /// What failed, for the log; `None` for [`HttpError::new`].
    source: Option<BoxError>,
}

impl HttpError {
    /// An answer of your choosing: `status` and a plain-text body `text`
    /// (what the client reads, so no internals in it).
    pub fn new(status: StatusCode, text: impl Into<Cow<'static, str>>) -> Self {
        HttpError {
            status,
            text: text.into(),
            retry_after: false,
            source: None,
        }
    }

    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The error it was made from, if any: for logs and tests.
    pub fn source(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// The first [`LockError`] in `error`'s chain decides the answer.
    fn from_boxed(error: BoxError) -> Self {
        let mut cause: Option<&(dyn Error + 'static)> = Some(&*error);
        while let Some(current) = cause {
            if let Some(lock) = current.downcast_ref::<LockError>() {
                return HttpError {
                    status: lock.status(),
                    text: Cow::Borrowed(lock.public_text()),
                    retry_after: matches!(lock, LockError::Busy { .. } | LockError::Timeout { .. }),
                    source: Some(error),
                };
            }
            cause = current.source();
        }
        HttpError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            text: Cow::Borrowed("internal error"),
            retry_after: false,
            source: Some(error),
        }
    }
}

impl<E: Error + Send + Sync + 'static> From<E> for HttpError {
    fn from(error: E) -> Self {
        HttpError::from_boxed(Box::new(error))
    }
}

/// The error and its causes, `: `-separated, for the log.
struct Chain<'a>(&'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(current) = cause {
            write!(f, ": {current}")?;
            cause = current.source();
        }
        Ok(())
    }
}

impl fmt::Debug for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpError")
            .field("status", &self.status.as_u16())
            .field("text", &self.text)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {}", self.status.as_u16(), Chain(&**source)),
            None => write!(f, "{}: {}", self.status.as_u16(), self.text),
        }
    }
}

/// The status and text; `Retry-After: 1` for a busy lock. A 5xx is logged
/// at WARN with the whole error chain, anything else at DEBUG.
impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = self.status.as_u16();
        if let Some(source) = &self.source {
            let error = Chain(&**source);
            if self.status.is_server_error() {
                tracing::warn!(error = %error, status, "error answered");
            } else {
                tracing::debug!(error = %error, status, "error answered");
            }
        }
        super::answer(self.status, self.text, self.retry_after)
    }
}

#[cfg(test)]
mod tests {
    use http::header::RETRY_AFTER;

    use super::*;

    #[derive(Debug)]
    struct Wrapper(LockError);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("paying failed")
        }
    }

    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_lock_error_anywhere_in_the_chain_answers_as_itself() {
        let busy = || LockError::Busy {
            key: "order:7".into(),
        };
        for error in [HttpError::from(busy()), HttpError::from(Wrapper(busy()))] {
            let response = error.into_response();
            assert_eq!(response.status(), 409);
            assert_eq!(response.headers()[RETRY_AFTER], "1");
        }
        let down = HttpError::from(Wrapper(LockError::backend("redis://h", "down")));
        assert_eq!(down.status(), 503);
        assert!(down.to_string().contains("paying failed: "), "{down}");
    }

    #[test]
    fn other_errors_are_a_500_that_keeps_its_details_in_the_log() {
        let error = HttpError::from(std::io::Error::other("disk on fire at /var/db"));
        assert_eq!(error.status(), 500);
        assert!(error.to_string().contains("disk on fire"));
        let response = error.into_response();
        assert_eq!(response.status(), 500);
        assert!(response.headers().get(RETRY_AFTER).is_none());
    }

    #[test]
    fn a_chosen_answer() {
        let error = HttpError::new(StatusCode::NOT_FOUND, "no such order");
        assert!(error.source().is_none());
        assert_eq!(error.into_response().status(), 404);
    }
}
