use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "stock:{sku}", segments = 4, mode = "write")]
async fn restock(sku: u64) -> Result<(), LockError> {
    let _ = sku;
    Ok(())
}

fn main() {}
