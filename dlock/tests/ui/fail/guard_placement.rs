// The guard is taken by shared reference, and the attribute goes on the
// method in the impl, not on the trait's declaration.
use dlock::{distributed_lock, LockError, LockGuard};

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64, guard: &mut LockGuard) -> Result<u64, LockError> {
    let _ = guard;
    Ok(id)
}

trait Payments {
    #[distributed_lock(key = "order:{id}")]
    async fn refund(&self, id: u64) -> Result<u64, LockError>;
}

fn main() {}
