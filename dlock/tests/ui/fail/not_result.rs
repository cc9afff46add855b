use dlock::distributed_lock;

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> u32 {
    id as u32
}

fn main() {}
