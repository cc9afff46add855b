use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "order:{order_id}")]
async fn pay(id: u64, user: String) -> Result<String, LockError> {
    Ok(format!("{id}{user}"))
}

fn main() {}
