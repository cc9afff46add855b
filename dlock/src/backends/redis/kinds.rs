//! Floor 5 of the Redis backend: the kinds of lock. The `LockBackend`
//! calls (`lock_backend.rs`), renewal (`renew.rs`), semaphores
//! (`permits.rs`), read-write locks (`rw.rs`, `rw/`), elections
//! (`election.rs`, `election/`), count-down latches (`latch.rs`), double
//! barriers (`barrier.rs`), several keys at once (`all_keys.rs`), the
//! operator's view (`inspect.rs`), refusals named with the ACL grant they
//! lack (`refused.rs`), a lock's wait riding through a Sentinel failover
//! (`ride_through.rs`), and one name, one lock across dlock's layout and
//! Redisson's (`mix.rs`).
//!
//! May use every floor below: `config`, `protocol`, `transport`,
//! `topology`, `calls`, `waiting`.

pub(crate) mod all_keys;
pub(crate) mod barrier;
pub(crate) mod election;
pub(crate) mod inspect;
pub(crate) mod latch;
pub(crate) mod lock_backend;
pub(crate) mod mix;
pub(crate) mod permits;
pub(crate) mod refused;
pub(crate) mod renew;
pub(crate) mod ride_through;
pub(crate) mod rw;
