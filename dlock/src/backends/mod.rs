//! The backends, one module each; all but `memory` sit behind a cargo feature.
//!
//! | backend | URL | feature | fencing token |
//! |---|---|---|---|
//! | [`memory::MemoryBackend`] | `memory://` | always | per-process counter |
//! | [`redis::RedisBackend`] | `redis://`, `rediss://`, `redis+cluster://` | `redis` (default), `tls` | per-key counter |
//! | [`redlock::RedlockBackend`] | `redlock://h1:port,h2:port,h3:port` | `redlock` | none (see its docs) |

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
