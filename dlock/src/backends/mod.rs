//! The backends, one module each; all but `memory` sit behind a cargo feature.
//!
//! | backend | URL | feature | fencing token |
//! |---|---|---|---|
//! | [`memory::MemoryBackend`] | `memory://` | always | per-process counter |
//! | [`redis::RedisBackend`] | `redis://`, `rediss://`, `redis+cluster://` | `redis` (default), `tls` | per-key counter |
//! | `etcd::EtcdBackend` | `etcd://host:2379[,host:2379...]`, `etcds://` | `etcd`, `tls` for `etcds://` | the key's create revision |
//! | `zookeeper::ZooKeeperBackend` | `zk://host:port[,host:port...][/chroot]` | `zookeeper` | the lock node's `czxid` |
//! | [`redlock::RedlockBackend`] | `redlock://h1:port,h2:port,h3:port` | `redlock` | none (see its docs) |

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;
