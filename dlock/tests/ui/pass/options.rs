// Every option: on_lost, renew, backend, a zero wait, humantime durations.
use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "a", on_lost = "continue", renew = false, ttl = "1m 30s")]
async fn continue_without_renewal() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", on_lost = "cancel", renew = true, ttl = "250ms")]
async fn cancel_with_renewal() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", backend = "jobs", wait = "0s")]
async fn named_backend_once() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", backend = "nowhere")]
async fn unregistered_backend() -> Result<(), LockError> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    dlock::registry().register("jobs", dlock::connect("memory://").await?);
    continue_without_renewal().await?;
    cancel_with_renewal().await?;
    named_backend_once().await?;
    let err = unregistered_backend().await.unwrap_err();
    assert!(matches!(err, LockError::NoBackend { ref name, .. } if name == "nowhere"), "{err}");
    Ok(())
}
