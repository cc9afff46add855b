use dlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["a:{x}", "b:{x}"], hold_at_least = "5s")]
async fn both(x: u8) -> Result<(), LockError> {
    let _ = x;
    Ok(())
}

fn main() {}
