//! A `#[distributed_lock]` handler that answers a bare `StatusCode` as its
//! error (feature `axum`): the lock error's status, 409 for contention
//! (issue 54: it was rustc's "`StatusCode: From<LockError>` is not
//! satisfied").
#![cfg(feature = "axum")]

use dlock::{distributed_lock, Lock};
use http::StatusCode;

#[distributed_lock(key = "axum-status:{id}", wait = "0s", backend = "axum-status")]
async fn pay(id: u64) -> Result<&'static str, StatusCode> {
    Ok("paid")
}

#[tokio::test]
async fn a_handler_answering_a_status_code_gets_the_lock_errors_status() {
    let backend = dlock::connect("memory://").await.unwrap();
    dlock::registry().register("axum-status", backend.clone());
    assert_eq!(pay(1).await, Ok("paid"));
    let held = Lock::new("axum-status:1")
        .with_backend(backend)
        .acquire()
        .await
        .unwrap();
    assert_eq!(pay(1).await, Err(StatusCode::CONFLICT));
    held.release().await.unwrap();
    assert_eq!(pay(1).await, Ok("paid"));
}
