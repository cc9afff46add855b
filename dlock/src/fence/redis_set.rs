//! The Redis fenced set as one call: [`REDIS_FENCED_SET`] run on the
//! caller's connection, its keys checked for one Cluster hash slot first.

use redis::cluster_routing::{Route, SlotAddr};
use tracing::Instrument;

use super::{FenceError, REDIS_FENCED_SET};

/// The script, hashed once: `invoke_async` sends `EVALSHA` and loads it
/// on a `NOSCRIPT`.
fn script() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(REDIS_FENCED_SET))
}

/// Sets `value_key` to `value` only under a fencing token at least as high
/// as the highest one `fence_key` has seen, and stores the token there: one
/// atomic script ([`REDIS_FENCED_SET`]) on `conn`. Answers `true` when it
/// wrote, `false` when it refused a stale token: a later holder has
/// written, this holder's lease is over; stop.
///
/// - The two keys must hash to one slot, as a Redis Cluster runs a script
///   on one node only: give them one hash tag (`{order:42}:status`,
///   `{order:42}:fence`). This is checked before anything is sent, on
///   every server kind, so code that works on one server keeps working on
///   a Cluster.
/// - `conn` is any async `redis` connection: a multiplexed connection, a
///   connection manager, a cluster connection.
/// - The fence key holds the token as a decimal number; tokens are compared
///   as Lua numbers (exact below 2^53).
/// - Runs in a `dlock.operation` span (`op = "fenced_set"`, the value key,
///   `outcome`: `written`, `refused` or `error`), counted in
///   `dlock_operations_total` with the `metrics` feature.
///
/// # Errors
/// [`FenceError::KeysInDifferentSlots`] before any I/O;
/// [`FenceError::Redis`] when Redis or the connection fails.
///
/// # Cancel safety
/// Cancelling the future may leave the script run or not; run it again
/// with the same token and value: a second run writes the same again.
///
/// ```no_run
/// # async fn pay(guard: &dlock::LockGuard, conn: &mut redis::aio::MultiplexedConnection) -> Result<(), dlock::fence::FenceError> {
/// let token = guard.fencing_token().expect("a fencing backend");
/// let written =
///     dlock::fence::redis_fenced_set(conn, "{order:42}:status", "{order:42}:fence", "paid", token)
///         .await?;
/// if !written {
///     // A later holder has written: this holder's lease is over. Stop.
/// }
/// # Ok(()) }
/// ```
pub async fn redis_fenced_set<C, V>(
    conn: &mut C,
    value_key: &str,
    fence_key: &str,
    value: V,
    token: u64,
) -> Result<bool, FenceError>
where
    C: redis::aio::ConnectionLike + Send,
    V: redis::ToRedisArgs + Send + Sync,
{
    let span = tracing::debug_span!(
        "dlock.operation",
        op = "fenced_set",
        key = %value_key,
        backend = "redis",
        fence = token,
        outcome = tracing::field::Empty
    );
    let result = async {
        same_slot(value_key, fence_key)?;
        let set: i64 = script()
            .key(value_key)
            .key(fence_key)
            .arg(token)
            .arg(value)
            .invoke_async(conn)
            .await?;
        Ok(set == 1)
    }
    .instrument(span.clone())
    .await;
    let outcome = match &result {
        Ok(true) => "written",
        Ok(false) => "refused",
        Err(_) => "error",
    };
    span.record("outcome", outcome);
    count(outcome);
    result
}

/// Refuses two keys a Cluster would keep in different slots.
fn same_slot(value_key: &str, fence_key: &str) -> Result<(), FenceError> {
    if Route::with_key(value_key, SlotAddr::Master) == Route::with_key(fence_key, SlotAddr::Master)
    {
        return Ok(());
    }
    Err(FenceError::KeysInDifferentSlots {
        value_key: value_key.to_owned(),
        fence_key: fence_key.to_owned(),
    })
}

// The label set of `dlock_operations_total` (see `inspect.rs`); `fence` uses
// no other module of dlock, so the counter is written out here.
#[cfg(feature = "metrics")]
fn count(outcome: &'static str) {
    metrics::counter!("dlock_operations_total", "backend" => "redis", "op" => "fenced_set", "outcome" => outcome)
        .increment(1);
}

#[cfg(not(feature = "metrics"))]
fn count(_: &'static str) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_hash_tag_share_a_slot_and_others_are_named() {
        assert!(same_slot("{order:42}:status", "{order:42}:fence").is_ok());
        let err = same_slot("order:42:status", "order:42:fence")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"order:42:status\"") && err.contains("hash tag"),
            "{err}"
        );
    }
}
