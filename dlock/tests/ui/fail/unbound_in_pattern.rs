// A placeholder that no parameter's pattern binds: one error, listing the
// names that are bound; the function is still usable by its callers (no
// second error at the call below).
use dlock::{distributed_lock, LockError, LockGuard};

struct Path<T>(T);
struct State<T>(T);

#[distributed_lock(key = "order:{order_id}")]
async fn pay(Path(id): Path<u64>, State(app): State<u8>, guard: &LockGuard) -> Result<u64, LockError> {
    Ok(id + u64::from(app) + guard.fencing_token().unwrap_or(0))
}

async fn caller() -> Result<u64, LockError> {
    pay(Path(1), State(2)).await
}

fn main() {
    let _ = caller;
}
