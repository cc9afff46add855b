//! Floor 1 of the Redis backend: the protocol's text. The Lua scripts and
//! their shared functions (`scripts.rs`, with the queue's and the other
//! layout's Lua in `scripts/`), the key names every script and request uses
//! (`KeyNames`), the Lua-free compare-and-set of Redis 8 (`compare_set.rs`)
//! and the scripts that renew many leases in one call (`renew_many.rs`).
//!
//! Shared with Redlock. Uses nothing of the backend but its root's shared
//! state: everything above builds requests from it.

pub(crate) mod compare_set;
pub(crate) mod renew_many;
pub(crate) mod scripts;
