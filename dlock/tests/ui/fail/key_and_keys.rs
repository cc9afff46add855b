use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "account:{from}", keys = ["account:{from}", "account:{to}"])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
