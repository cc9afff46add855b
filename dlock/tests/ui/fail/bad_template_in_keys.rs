use dlock::{distributed_lock, LockError};

// The second template names no parameter; the third has an unclosed brace.
#[distributed_lock(keys = ["account:{from}", "account:{too}", "audit:{from"])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
