//! What a fenced-write helper refuses before anything reaches a server.

/// A fenced write that could not be built or run: the input it names is
/// wrong (an identifier, a column list, the number of values), the two Redis
/// keys live in different hash slots, or Redis answered with an error.
///
/// Every refusal of the input happens before any I/O, so a caller can build
/// its statements once at start-up and fail early.
///
/// ```
/// use dlock::fence::{FenceError, FencedUpdate};
/// let err = FencedUpdate::new("orders", "id").postgres().unwrap_err();
/// assert!(matches!(err, FenceError::NoColumnsToSet { .. }));
/// assert!(err.to_string().contains("add one with `set(column)`"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// An identifier (table, schema or column) the dialect cannot spell.
    #[error("invalid {what} {name:?} for a fenced write: {reason}")]
    InvalidIdentifier {
        /// Which input: `table`, `schema`, `key column`, `set column` or `fence column`.
        what: &'static str,
        /// The identifier as given.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// No column to set: a fenced write must write something besides the fence.
    #[error("the fenced write to table {table:?} sets no column: add one with `set(column)`")]
    NoColumnsToSet {
        /// The table the write is for.
        table: String,
    },
    /// A column named twice (two `set`s, or the key or fence column among them).
    #[error("column {column:?} is named twice in a fenced write: {reason}")]
    DuplicateColumn {
        /// The column named twice.
        column: String,
        /// Where it was named the second time.
        reason: &'static str,
    },
    /// The values given do not match the columns to set, one for one.
    #[error(
        "the fenced write sets {columns} column(s) but {values} value(s) were given: give one value per `set` column, in order"
    )]
    ValueCount {
        /// How many columns the statement sets.
        columns: usize,
        /// How many values were given.
        values: usize,
    },
    /// The value key and the fence key of a Redis fenced set hash to
    /// different slots, so a Redis Cluster cannot run the script on both.
    #[error(
        "value key {value_key:?} and fence key {fence_key:?} hash to different Redis Cluster slots, so one script cannot touch both: give them one hash tag, e.g. `{{order:42}}:status` and `{{order:42}}:fence`"
    )]
    KeysInDifferentSlots {
        /// The value key.
        value_key: String,
        /// The fence key.
        fence_key: String,
    },
    /// Redis answered the fenced set with an error (or the connection failed).
    #[cfg(feature = "redis")]
    #[error("the fenced set failed on Redis: {0}")]
    Redis(#[from] redis::RedisError),
}
