use dlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["account:{from}", "account:{to}"], mode = "read")]
async fn audit(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
