// All argument mistakes are reported at once, and the function is still
// emitted, so its callers get no error of their own.
use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "order:{}", wait = "soon", renew = "yes", backend = 1)]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

async fn caller() -> Result<u64, LockError> {
    pay(1).await
}

fn main() {
    let _ = caller();
}
