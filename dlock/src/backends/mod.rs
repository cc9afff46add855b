//! The backends, one module each; all but `memory` sit behind a cargo feature.
//!
//! | backend | URL | feature | fencing token |
//! |---|---|---|---|
//! | [`memory::MemoryBackend`] | `memory://` | always | per-process counter |
//! | [`redis::RedisBackend`] | `redis://`, `rediss://`, `redis+cluster://` | `redis` (default), `tls` | per-key counter |
//! | `zookeeper::ZooKeeperBackend` | `zk://host:port[,host:port...][/chroot]` | `zookeeper` | the lock node's `czxid` |

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;
