// `segments = N` takes one free segment of a split resource; the guard says which.
use dlock::{distributed_lock, LockError, LockGuard};

#[distributed_lock(key = "stock:{sku}", segments = 5, wait = "5s")]
async fn buy(sku: u64, guard: &LockGuard) -> Result<usize, LockError> {
    let segment = guard.segment().expect("a segmented lock's guard names its segment");
    assert_eq!(guard.key(), format!("stock:{sku}#{segment}"));
    Ok(segment)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    let segment = buy(10001).await?;
    assert!(segment < 5);
    // The lock was released before `buy` returned: calling again works.
    assert!(buy(10001).await? < 5);
    Ok(())
}
