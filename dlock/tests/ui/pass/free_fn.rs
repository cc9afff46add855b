// A free function with and without the guard parameter, run on the memory backend.
use dlock::{distributed_lock, LockError, LockGuard};

#[distributed_lock(key = "order:{id}")]
async fn without_guard(id: u64) -> Result<u64, LockError> {
    Ok(id + 1)
}

#[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s")]
async fn with_guard(id: u64, guard: &LockGuard) -> Result<String, LockError> {
    assert!(guard.is_held());
    Ok(guard.key().to_owned())
}

// The guard may come first, have any name, and be ignored.
#[distributed_lock(key = "order:{id}")]
async fn guard_first(_: &dlock::LockGuard, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    assert_eq!(without_guard(1).await?, 2);
    assert_eq!(with_guard(42).await?, "order:42");
    assert_eq!(guard_first(3).await?, 3);
    Ok(())
}
