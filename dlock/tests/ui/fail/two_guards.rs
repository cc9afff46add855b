use dlock::{distributed_lock, LockError, LockGuard};

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64, guard: &LockGuard, again: &dlock::LockGuard) -> Result<u64, LockError> {
    let _ = (guard, again);
    Ok(id)
}

fn main() {}
