use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "prices:{region}", mode = "shared")]
async fn quote(region: u32) -> Result<(), LockError> {
    let _ = region;
    Ok(())
}

fn main() {}
