use dlock::distributed_lock;

/// An application error that cannot carry a `LockError` (no `From` impl).
#[derive(Debug)]
pub struct AppError;

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {}
