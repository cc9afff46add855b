// `mode = "read"` / `mode = "write"` take one side of an `RwLock` on the key:
// readers of a key share it, a writer holds it alone. The guard is the same
// `LockGuard` as a plain lock's.
use std::time::Duration;

use dlock::{distributed_lock, LockError, LockGuard, RwLock};

#[distributed_lock(key = "prices:{region}", mode = "read", ttl = "10s")]
async fn read_prices(region: u32, guard: &LockGuard) -> Result<bool, LockError> {
    assert!(guard.is_held());
    // Elsewhere (another task, outside this body's scope), another reader
    // of the key gets in at once; a writer does not.
    let lock = RwLock::new(format!("prices:{region}"));
    let elsewhere = tokio::spawn(async move {
        let other_reader = lock.try_read().await?;
        let writer = lock.try_write().await?;
        Ok::<_, LockError>(other_reader.is_some() && writer.is_none())
    });
    elsewhere.await.expect("the task ran")
}

#[distributed_lock(key = "prices:{region}", mode = "write", wait = "5s")]
async fn write_prices(region: u32) -> Result<bool, LockError> {
    let lock = RwLock::new(format!("prices:{region}"));
    // Taken from another task: the writer here keeps readers out.
    let reader = tokio::spawn(async move { lock.wait(Duration::ZERO).read().await });
    let busy = matches!(reader.await, Ok(Err(LockError::Busy { .. })));
    Ok(busy)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    assert!(read_prices(7).await?);
    assert!(write_prices(7).await?);
    // Both released before returning: a writer gets in at once.
    assert!(RwLock::new("prices:7").try_write().await?.is_some());
    Ok(())
}
