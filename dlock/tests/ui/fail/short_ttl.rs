use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "order:{id}", ttl = "10ms")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
