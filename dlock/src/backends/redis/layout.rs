//! Floor 6 of the Redis backend: the key layouts beside dlock's own.
//! Redisson's `RLock` layout (`redisson.rs`, `redisson/`: a `RedisBackend`
//! wrapped); one name, one lock across the two is `kinds/mix.rs`, which
//! dlock's own lock checks after a grant.
//!
//! May use every floor below.

pub mod redisson;
