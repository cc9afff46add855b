use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "order:{id}")]
fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
