use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "job:{id}", ttl = "400days")]
async fn run(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
