//! Floor 6 of the Redis backend: the key layouts beside dlock's own.
//! Redisson's `RLock` layout (`redisson.rs`, `redisson/`: a `RedisBackend`
//! wrapped) and one name, one lock across the two (`mix.rs`).
//!
//! May use every floor below.

pub(crate) mod mix;
pub mod redisson;
