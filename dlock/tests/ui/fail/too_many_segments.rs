use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "stock:{sku}", segments = 100000)]
async fn buy(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

fn main() {}
