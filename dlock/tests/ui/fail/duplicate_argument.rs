use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "order:{id}", ttl = "30s", ttl = "10s")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
