// A number is never a duration: refused at once, with both forms that are.
use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "order:{id}", ttl = 30, wait = 5)]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
