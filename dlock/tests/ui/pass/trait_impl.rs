// Trait-impl methods: native `async fn` in traits, and `#[async_trait]` (which
// runs first, on the impl; the attribute wraps the future it produces).
use std::future::Future;
use std::pin::Pin;

use dlock::backend::async_trait;
use dlock::{distributed_lock, LockError, LockGuard};

struct Store {
    shard: u32,
}

trait Native {
    async fn put(&self, key: &str) -> Result<String, LockError>;
}

impl Native for Store {
    #[distributed_lock(key = "{self.shard}:{key}", wait = "0s")]
    async fn put(&self, key: &str, guard: &LockGuard) -> Result<String, LockError> {
        Ok(guard.key().to_owned())
    }
}

#[async_trait]
trait Boxed {
    async fn get(&self, key: String) -> Result<String, LockError>;
}

#[async_trait]
impl Boxed for Store {
    /// Docs on the method are kept.
    #[distributed_lock(key = "{self.shard}:{key}")]
    async fn get(&self, key: String, guard: &LockGuard) -> Result<String, LockError> {
        Ok(format!("{} {}", guard.key(), key))
    }
}

// The same shape written by hand: a boxed `async move` block.
#[distributed_lock(key = "boxed:{n}")]
fn boxed(n: u8) -> Pin<Box<dyn Future<Output = Result<u8, LockError>> + Send>> {
    Box::pin(async move {
        let doubled = n.checked_mul(2).ok_or(LockError::InvalidOption {
            reason: "overflow".into(),
        })?;
        Ok(doubled)
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    let store = Store { shard: 2 };
    assert_eq!(store.put("a").await?, "2:a");
    let boxed: Box<dyn Boxed + Send + Sync> = Box::new(store);
    assert_eq!(boxed.get("b".into()).await?, "2:b b");
    assert_eq!(self::boxed(4).await?, 8);
    Ok(())
}
