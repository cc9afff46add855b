// A setting's expression of the wrong type: the error points at it and
// says what to write.
use dlock::{distributed_lock, LockError};

struct Config {
    lock_ttl_secs: u64,
    lock_backend: u32,
}

static CONFIG: Config = Config { lock_ttl_secs: 30, lock_backend: 1 };

#[distributed_lock(key = "order:{id}", ttl = CONFIG.lock_ttl_secs)]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:{id}", backend = CONFIG.lock_backend)]
async fn refund(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
