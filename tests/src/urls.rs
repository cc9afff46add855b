//! What the tests of every backend check of a URL that cannot work.

use dlock::LockError;

/// The error `dlock::connect(url)` fails with, which must be a clear
/// `InvalidOption`: a URL that cannot work is never a panic, nor a
/// connection attempt.
pub async fn invalid_option(url: &str) -> LockError {
    let err = dlock::connect(url)
        .await
        .err()
        .unwrap_or_else(|| panic!("{url}: connected"));
    assert!(
        matches!(err, LockError::InvalidOption { .. }),
        "{url}: {err:?}"
    );
    err
}
