//! An axum 0.8 service whose `POST /orders/{id}/pay` is a critical section
//! per order, across every instance of the service.
//!
//! The handler does a read-sleep-write of a counter in Redis: without the
//! lock, concurrent requests on one order lose increments; with it, the
//! counter equals the number of successful requests. Errors answer through
//! dlock's `axum` feature (`HttpError`): a busy order is 409 with
//! `Retry-After`, a failing lock service 503, a failing store 500. The
//! lock's ttl and wait come from the configuration (`LOCK_TTL_MS`,
//! `LOCK_WAIT_MS`), evaluated by the attribute at each request.
//!
//! ```sh
//! redis-server --port 6379 &
//! cargo run -p dlock-examples --features web --example web_service              # PORT=3000
//! PORT=3001 cargo run -p dlock-examples --features web --example web_service    # a second instance
//! curl -X POST http://127.0.0.1:3000/orders/7/pay; curl http://127.0.0.1:3001/orders/7
//! ```
//!
//! `DLOCK_URL` (default `redis://127.0.0.1:6379`) is the lock service and
//! the counter's store; `PORT` the port (default 3000). Run by
//! `tests/tests/web_service.rs` as two instances under 200 concurrent
//! requests.

use std::sync::LazyLock;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::Router;
use dlock::{distributed_lock, HttpError, LockGuard};
use redis::AsyncCommands;

/// The service's configuration, read once: the lock's settings come from
/// here, not from literals in the attribute.
struct Config {
    /// `LOCK_TTL_MS`, default 10 s.
    lock_ttl: Duration,
    /// `LOCK_WAIT_MS`, default 5 s.
    lock_wait: Duration,
}

fn millis_from_env(name: &str, default: u64) -> Duration {
    let millis = std::env::var(name).ok().and_then(|v| v.parse().ok());
    Duration::from_millis(millis.unwrap_or(default))
}

static CONFIG: LazyLock<Config> = LazyLock::new(|| Config {
    lock_ttl: millis_from_env("LOCK_TTL_MS", 10_000),
    lock_wait: millis_from_env("LOCK_WAIT_MS", 5_000),
});

/// What every handler shares: the store of the counters.
#[derive(Clone)]
struct App {
    store: redis::aio::MultiplexedConnection,
}

// No error type of our own: `HttpError` (dlock's `axum` feature) takes any
// error with `?`; a lock error answers 409 (with `Retry-After`) or 503, a
// store error 500 with the details in the log.

fn counter(id: u64) -> String {
    format!("web-example:order:{id}:paid")
}

/// Pays order `id`: one request per order at a time in the whole fleet.
/// `#[axum::debug_handler]` goes below `#[distributed_lock]`, so that it
/// checks the function callers see (without the guard parameter).
#[distributed_lock(key = "order:{id}", ttl = CONFIG.lock_ttl, wait = CONFIG.lock_wait)]
#[axum::debug_handler]
async fn pay(
    Path(id): Path<u64>,
    State(app): State<App>,
    guard: &LockGuard,
) -> Result<String, HttpError> {
    let mut store = app.store.clone();
    // A read-sleep-write: safe only because the lock is held.
    let paid: Option<u64> = store.get(counter(id)).await?;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let paid = paid.unwrap_or(0) + 1;
    // Right before the side effect: still ours? (No round trip.)
    guard.ensure()?;
    let () = store.set(counter(id), paid).await?;
    Ok(format!(
        "order {id}: payment {paid} (fence {:?})\n",
        guard.fencing_token()
    ))
}

/// How many payments order `id` has.
async fn paid(Path(id): Path<u64>, State(app): State<App>) -> Result<String, HttpError> {
    let mut store = app.store.clone();
    let paid: Option<u64> = store.get(counter(id)).await?;
    Ok(format!("{}\n", paid.unwrap_or(0)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |p| p.parse())?;
    dlock::registry().set_default(dlock::connect(&url).await?);
    let store = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let app = Router::new()
        .route("/orders/{id}/pay", post(pay))
        .route("/orders/{id}", get(paid))
        .with_state(App { store });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
