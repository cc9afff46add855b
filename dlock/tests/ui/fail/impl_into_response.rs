// An axum handler returning `impl IntoResponse` (here any opaque type: the
// attribute cannot build a lock error into one): the error names HttpError.
use dlock::distributed_lock;

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> impl std::fmt::Debug {
    id
}

fn main() {}
