//! The flash sale with a split stock: 1000 items stored as 5 rows of 200,
//! 2 000 buyers at once, each row guarded by its own segment lock.
//!
//! `cargo run --release -p dlock-examples --example seckill_segmented` runs on
//! the in-process backend; set `DLOCK_URL=redis://127.0.0.1:6379` (or any
//! dlock URL) to run the same code against a real lock service.
//!
//! Every sale reads a row, pauses (the database round trip) and writes it
//! back, so a row must have one seller at a time. With one lock for the SKU
//! the whole sale is serial; with `segments = 5` five rows sell at once.
//! Both sell exactly 1000; the segmented one about five times faster.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{distributed_lock, LockError, LockGuard};

const BUYERS: u32 = 2_000;
const STOCK: i64 = 1_000;
const SEGMENTS: usize = 5;
const SKU: u64 = 10001;

/// What a buyer can run into.
#[derive(Debug)]
enum ShopError {
    /// The row this buyer locked is empty: try another row.
    RowEmpty,
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

/// The stock of one SKU, stored as rows that are read and written in two
/// steps, like a database without transactions.
struct Shop {
    rows: Vec<AtomicI64>,
    sold: AtomicU32,
}

impl Shop {
    /// `stock` split evenly over `rows` rows.
    fn new(stock: i64, rows: usize) -> Arc<Self> {
        let per_row = stock / rows as i64;
        Arc::new(Shop {
            rows: (0..rows).map(|_| AtomicI64::new(per_row)).collect(),
            sold: AtomicU32::new(0),
        })
    }

    fn left(&self) -> i64 {
        self.rows.iter().map(|r| r.load(Ordering::SeqCst)).sum()
    }

    /// Read, check, pause (the round trip), write: safe only while the row's
    /// lock is held.
    async fn sell_from(&self, row: usize) -> Result<(), ShopError> {
        let left = self.rows[row].load(Ordering::SeqCst);
        if left <= 0 {
            return Err(ShopError::RowEmpty);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.rows[row].store(left - 1, Ordering::SeqCst);
        self.sold.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One lock for the SKU: the whole stock is one row.
#[distributed_lock(key = "single:{sku}", ttl = "10s", wait = "60s")]
async fn sell_single(shop: Arc<Shop>, sku: u64) -> Result<(), ShopError> {
    shop.sell_from(0).await
}

/// One of 5 segment locks: the guard says which row this buyer holds.
#[distributed_lock(key = "stock:{sku}", segments = 5, ttl = "10s", wait = "60s")]
async fn sell_segmented(shop: Arc<Shop>, sku: u64, guard: &LockGuard) -> Result<(), ShopError> {
    let row = guard.segment().unwrap_or(0);
    shop.sell_from(row).await
}

/// A buyer: keeps trying (another row, when its row ran empty) until it
/// bought one item or the whole stock is gone.
async fn buyer<F, Fut>(shop: Arc<Shop>, sell: F) -> Result<bool, LockError>
where
    F: Fn(Arc<Shop>, u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), ShopError>>,
{
    while shop.left() > 0 {
        match sell(shop.clone(), SKU).await {
            Ok(()) => return Ok(true),
            Err(ShopError::RowEmpty) => continue,
            Err(ShopError::Lock(e)) => return Err(e),
        }
    }
    Ok(false)
}

/// Runs the sale; returns items sold and how long it took.
async fn run_sale<F, Fut>(rows: usize, sell: F) -> Result<(u32, Duration), LockError>
where
    F: Fn(Arc<Shop>, u64) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = Result<(), ShopError>> + Send + 'static,
{
    let shop = Shop::new(STOCK, rows);
    let start = Instant::now();
    let buyers: Vec<_> = (0..BUYERS)
        .map(|_| tokio::spawn(buyer(shop.clone(), sell)))
        .collect();
    for b in buyers {
        b.await.expect("a buyer panicked")?;
    }
    let took = start.elapsed();
    assert_eq!(shop.left(), 0, "the sale ends with the stock gone");
    Ok((shop.sold.load(Ordering::SeqCst), took))
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://".to_owned());
    dlock::registry().set_default(dlock::connect(&url).await?);
    println!(
        "seckill: {BUYERS} buyers, {STOCK} items, lock service {}",
        dlock::url::redact(&url)
    );

    let (sold, took) = run_sale(1, sell_single).await?;
    let single_rate = f64::from(sold) / took.as_secs_f64();
    println!("one lock:            sold = {sold}, {took:>8.2?}, {single_rate:>6.0} sales/s");
    assert_eq!(
        i64::from(sold),
        STOCK,
        "one lock must sell exactly the stock"
    );

    let (sold, took) = run_sale(SEGMENTS, sell_segmented).await?;
    let rate = f64::from(sold) / took.as_secs_f64();
    println!(
        "{SEGMENTS} segment locks:     sold = {sold}, {took:>8.2?}, {rate:>6.0} sales/s  ({:.1}× one lock)",
        rate / single_rate
    );
    assert_eq!(
        i64::from(sold),
        STOCK,
        "segments must sell exactly the stock"
    );
    Ok(())
}
