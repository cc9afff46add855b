// `hold_at_least`: the key stays taken after the body ended, so a second
// call within that time finds it taken (`wait = "0s"`: Busy).
use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "job:{name}", wait = "0s", hold_at_least = "30s")]
async fn job(name: &str) -> Result<(), LockError> {
    let _ = name;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    job("invoices").await?;
    assert!(matches!(job("invoices").await, Err(LockError::Busy { .. })));
    job("reports").await?;
    Ok(())
}
