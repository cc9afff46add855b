//! The seckill case: 200 buyers race for the last 10 items in stock.
//!
//! `cargo run -p dlock-examples --example quickstart` runs on the in-process
//! backend; set `DLOCK_URL=redis://127.0.0.1:6379` (or any dlock URL) to run
//! the same code against a real lock service. It builds with dlock's default
//! features (memory and Redis) so that it needs nothing but cargo; for
//! `etcd://`, `zk://` or `redlock://` add `--features dlock/full`.
//!
//! The stock is read, checked and written back with a pause between (a
//! database round trip). Without a lock, buyers interleave there and the shop
//! sells more than it has. With `#[distributed_lock]`, exactly 10 sell.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::{distributed_lock, LockError, LockGuard};

const BUYERS: u32 = 200;
const STOCK: i64 = 10;

/// What a buyer can run into.
#[derive(Debug)]
enum ShopError {
    SoldOut,
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

/// The shop's stock table: one row, read and written in two steps like a
/// database without transactions.
#[derive(Default)]
struct Shop {
    stock: AtomicI64,
    sold: AtomicU32,
}

impl Shop {
    fn new(stock: i64) -> Arc<Self> {
        Arc::new(Shop {
            stock: AtomicI64::new(stock),
            sold: AtomicU32::new(0),
        })
    }

    /// Read, check, pause (the round trip), write: the race every
    /// hand-rolled seckill has.
    async fn sell_one(&self) -> Result<(), ShopError> {
        let left = self.stock.load(Ordering::SeqCst);
        if left <= 0 {
            return Err(ShopError::SoldOut);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.stock.store(left - 1, Ordering::SeqCst);
        self.sold.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Without a lock.
async fn buy_unlocked(shop: Arc<Shop>, _sku: u64) -> Result<(), ShopError> {
    shop.sell_one().await
}

/// With a lock on the item: one buyer at a time, across every process that
/// uses the same lock service.
#[distributed_lock(key = "stock:{sku}", ttl = "10s", wait = "30s")]
async fn buy_locked(shop: Arc<Shop>, sku: u64, guard: &LockGuard) -> Result<(), ShopError> {
    // The fencing token would go with the write to the real stock table,
    // and `ensure()` checks, without a round trip, that the lock is still
    // ours right before it.
    let _fence = guard.fencing_token();
    guard.ensure()?;
    shop.sell_one().await
}

async fn run_sale<F, Fut>(buy: F) -> (u32, i64)
where
    F: Fn(Arc<Shop>, u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), ShopError>> + Send + 'static,
{
    let shop = Shop::new(STOCK);
    let buyers: Vec<_> = (0..BUYERS)
        .map(|_| tokio::spawn(buy(shop.clone(), 10001)))
        .collect();
    for buyer in buyers {
        match buyer.await.expect("a buyer panicked") {
            Ok(()) | Err(ShopError::SoldOut) => {}
            Err(ShopError::Lock(e)) => eprintln!("lock error: {e}"),
        }
    }
    (
        shop.sold.load(Ordering::SeqCst),
        shop.stock.load(Ordering::SeqCst),
    )
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://".to_owned());
    dlock::registry().set_default(dlock::connect(&url).await?);
    println!(
        "seckill: {BUYERS} buyers, {STOCK} items in stock, lock service {}",
        dlock::url::redact(&url)
    );

    let (sold, left) = run_sale(buy_unlocked).await;
    println!(
        "without a lock: sold {sold:>3}, stock left {left:>3}   <- oversold by {}",
        sold as i64 - STOCK
    );

    let (sold, left) = run_sale(buy_locked).await;
    println!("with dlock:     sold {sold:>3}, stock left {left:>3}");
    assert_eq!(sold as i64, STOCK, "the lock must sell exactly the stock");
    Ok(())
}
