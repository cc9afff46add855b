// Placeholders are rendered with `Display`; rustc's own errors point into the key.
use dlock::{distributed_lock, LockError};

struct User {
    id: u64,
}

#[distributed_lock(key = "user:{user}")]
async fn by_user(user: User) -> Result<u64, LockError> {
    Ok(user.id)
}

#[distributed_lock(key = "user:{user.name}")]
async fn by_name(user: &User) -> Result<u64, LockError> {
    Ok(user.id)
}

fn main() {}
