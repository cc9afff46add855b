//! The backends, one module each; all but `memory` sit behind a cargo feature.
//!
//! | backend | URL | feature | fencing token |
//! |---|---|---|---|
//! | [`memory::MemoryBackend`] | `memory://` | always | per-process counter |
//! | [`redis::RedisBackend`] | `redis://`, `rediss://`, `redis+cluster://` | `redis` (default), `tls` | per-key counter |

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
