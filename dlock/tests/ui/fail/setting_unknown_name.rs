// An expression naming nothing in scope: rustc's own error, on the name.
use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "order:{id}", ttl = config.lock_ttl)]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
