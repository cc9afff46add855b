use dlock::{distributed_lock, LockError, LockGuard};

#[distributed_lock(keys = ["account:{from}", "account:{to}"])]
async fn transfer(from: u64, to: u64, guard: &LockGuard) -> Result<(), LockError> {
    let _ = (from, to, guard);
    Ok(())
}

fn main() {}
