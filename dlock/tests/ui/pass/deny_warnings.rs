// The expansion adds no warning to user code, even where the body always
// returns early and where the guard's type is imported only for the parameter.
#![deny(warnings)]

use dlock::{distributed_lock, LockError, LockGuard};

#[distributed_lock(key = "w:{id}")]
async fn early(id: u32, _guard: &LockGuard) -> Result<u32, LockError> {
    return Ok(id);
}

#[distributed_lock(key = "w:{id}:{name}")]
async fn question_mark(id: u32, name: String) -> Result<usize, LockError> {
    let n: Result<usize, LockError> = Ok(name.len());
    Ok(n? + id as usize)
}

#[distributed_lock(key = "constant")]
async fn constant_key() -> Result<(), LockError> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    assert_eq!(early(1).await?, 1);
    assert_eq!(question_mark(1, "ab".into()).await?, 3);
    constant_key().await
}
