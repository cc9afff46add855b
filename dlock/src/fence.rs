//! Fenced writes: the storage side of a fencing token.
//!
//! A lock alone cannot stop a holder that was paused past its lease (a GC
//! pause, a frozen VM) from writing after the next holder started: when it
//! wakes, it still believes it holds the lock. The fencing token closes
//! that window, but only where the write lands: the store must refuse a
//! write whose token is lower than one it has already seen. This module
//! gives that refusal for the stores people use, each tested with a paused
//! stale holder whose write is refused (`tests/tests/fenced_writes.rs`):
//!
//! - [`FenceKeeper`]: an in-process store (a map, a cache, a file the
//!   process owns) remembers the highest token per resource and runs a
//!   write only under a token at least that high;
//! - [`FencedUpdate`]: the fenced `UPDATE` (or upsert) for a table of
//!   yours, spelled for PostgreSQL or MySQL/MariaDB ([`SqlDialect`]):
//!   identifiers quoted, values bound as parameters, and a stale token
//!   changes 0 rows;
//! - `redis_fenced_set` (feature `redis`): one call that sets a Redis key
//!   only under a token at least as high as the one kept beside it, in
//!   one atomic script (`REDIS_FENCED_SET`, which it runs);
//! - `SQL_FENCED_UPDATE` (feature `postgres`): a fixed example of the SQL,
//!   for a table `orders`; build yours with [`FencedUpdate`].
//!
//! A token equal to the highest seen is accepted: it is the same holder's
//! lease writing again. Fencing tokens only grow per key
//! ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token)); use one
//! store resource per lock key, or the highest token across the keys that
//! guard it.

mod error;
#[cfg(feature = "redis")]
mod redis_set;
mod sql;

pub use error::FenceError;
#[cfg(feature = "redis")]
pub use redis_set::redis_fenced_set;
pub use sql::{FencedUpdate, SqlDialect};

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

/// Remembers the highest fencing token seen per resource, and runs a write
/// only under a token at least that high.
///
/// ```
/// use dlock::fence::FenceKeeper;
///
/// let keeper = FenceKeeper::new();
/// let mut balance = 100;
/// // The holder of fence 7 writes; a later holder (fence 9) writes.
/// keeper.write("account:42", 7, || balance -= 10).unwrap();
/// keeper.write("account:42", 9, || balance -= 20).unwrap();
/// // The holder of fence 7 wakes from a pause and writes again: refused.
/// let stale = keeper.write("account:42", 7, || balance -= 10).unwrap_err();
/// assert_eq!((stale.token, stale.highest), (7, 9));
/// assert_eq!(balance, 70);
/// ```
#[derive(Debug, Default)]
pub struct FenceKeeper {
    highest: Mutex<HashMap<String, u64>>,
}

impl FenceKeeper {
    /// A keeper that has seen no token yet.
    pub fn new() -> Self {
        FenceKeeper::default()
    }

    /// Runs `write` if `token` is at least the highest token seen for
    /// `resource`, and records it; otherwise returns [`StaleFence`] and runs
    /// nothing. The check and the write happen under one lock, so a higher
    /// token cannot slip in between them; keep `write` short.
    ///
    /// # Errors
    /// [`StaleFence`] when a higher token was seen for `resource`.
    pub fn write<T>(
        &self,
        resource: &str,
        token: u64,
        write: impl FnOnce() -> T,
    ) -> Result<T, StaleFence> {
        let mut highest = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        let seen = highest.get(resource).copied().unwrap_or(0);
        if token < seen {
            return Err(StaleFence {
                resource: resource.to_owned(),
                token,
                highest: seen,
            });
        }
        let out = write();
        highest.insert(resource.to_owned(), token);
        Ok(out)
    }

    /// The highest token seen for `resource` (0: none).
    pub fn highest(&self, resource: &str) -> u64 {
        let highest = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        highest.get(resource).copied().unwrap_or(0)
    }
}

/// A write refused because a higher fencing token was seen for its
/// resource: the writer's lease ended and another holder has written since.
/// Stop, and do not retry with the same token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleFence {
    /// The resource written to.
    pub resource: String,
    /// The refused token.
    pub token: u64,
    /// The highest token seen for the resource.
    pub highest: u64,
}

impl fmt::Display for StaleFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "write to `{}` refused: fencing token {} is below {} already seen (the lock was lost, and a later holder has written)",
            self.resource, self.token, self.highest
        )
    }
}

impl std::error::Error for StaleFence {}

/// A Redis script that sets a value only under a fencing token at least as
/// high as the highest one the key has seen, kept beside the value.
///
/// [`redis_fenced_set`] runs it in one call; the script is here for
/// clients other than the `redis` crate's.
///
/// `EVAL REDIS_FENCED_SET 2 <value key> <fence key> <token> <value>`: answers
/// `1` when it set the value (and stored the token as the highest), `0` when
/// it refused a stale token. Keep the two keys in one hash slot on a
/// Cluster (`{order:42}:value`, `{order:42}:fence`). Tokens are compared as
/// integers (they stay below 2^53).
///
/// ```no_run
/// # async fn pay(guard: &dlock::LockGuard, conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
/// let token = guard.fencing_token().expect("a fencing backend");
/// let set: i64 = redis::Script::new(dlock::fence::REDIS_FENCED_SET)
///     .key("{order:42}:status")
///     .key("{order:42}:fence")
///     .arg(token)
///     .arg("paid")
///     .invoke_async(conn)
///     .await?;
/// if set == 0 {
///     // A later holder has written: this holder's lease is over. Stop.
/// }
/// # Ok(()) }
/// ```
#[cfg(feature = "redis")]
pub const REDIS_FENCED_SET: &str = r#"
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[1])
if token == nil then
  return redis.error_reply('the fencing token must be a number')
end
if token < seen then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
"#;

/// An example of a fenced update in SQL, for one table: `orders` with a
/// `status` and a `fence` column (PostgreSQL; for MySQL and MariaDB write
/// `?` for `$1` and `$2`, and bind the token twice). The table keeps the
/// fencing token of the last write in its `fence` column, and the update
/// touches its row only under a token at least as high. A stale holder's
/// update changes 0 rows: check the count.
///
/// For a table of yours, build the statement with [`FencedUpdate`]: it
/// quotes your names, binds your values, spells MySQL too, and has an
/// upsert for a row that does not exist yet.
///
/// ```sql
/// -- once:
/// ALTER TABLE orders ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
/// ```
///
/// ```no_run
/// # async fn pay(guard: &dlock::LockGuard, db: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
/// let token = guard.fencing_token().expect("a fencing backend") as i64;
/// let updated = db
///     .execute(dlock::fence::SQL_FENCED_UPDATE, &[&token, &42_i64])
///     .await?;
/// if updated == 0 {
///     // A later holder has written: this holder's lease is over. Stop.
/// }
/// # Ok(()) }
/// ```
#[cfg(feature = "postgres")]
pub const SQL_FENCED_UPDATE: &str =
    "UPDATE orders SET status = 'paid', fence = $1 WHERE id = $2 AND fence <= $1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_tokens_write_again_and_lower_ones_are_refused() {
        let keeper = FenceKeeper::new();
        assert!(keeper.write("r", 5, || ()).is_ok());
        assert!(keeper.write("r", 5, || ()).is_ok(), "the same lease again");
        assert_eq!(keeper.highest("r"), 5);
        let stale = keeper.write("r", 4, || unreachable!()).unwrap_err();
        assert_eq!(stale.highest, 5);
        assert!(stale.to_string().contains("fencing token 4 is below 5"));
        // Resources are fenced apart.
        assert!(keeper.write("other", 1, || ()).is_ok());
    }
}
