//! Floor 5 of the Redis backend: the kinds of lock. The `LockBackend`
//! calls (`lock_backend.rs`), renewal (`renew.rs`), semaphores
//! (`permits.rs`), read-write locks (`rw.rs`, `rw/`), elections
//! (`election.rs`, `election/`), double barriers (`barrier.rs`), several
//! keys at once (`all_keys.rs`), the
//! operator's view (`inspect.rs`) and refusals named with the ACL grant
//! they lack (`refused.rs`).
//!
//! May use every floor below: `config`, `protocol`, `transport`,
//! `topology`, `calls`, `waiting`.

pub(crate) mod all_keys;
pub(crate) mod barrier;
pub(crate) mod election;
pub(crate) mod inspect;
pub(crate) mod lock_backend;
pub(crate) mod permits;
pub(crate) mod refused;
pub(crate) mod renew;
pub(crate) mod rw;
