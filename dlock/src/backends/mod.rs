//! The backends, one module each; all but `memory` sit behind a cargo feature.
//!
//! [`connect`](crate::connect) finds a URL's backend in one table of
//! scheme → backend, feature, semaphores and read-write locks (`schemes.rs`); this is that
//! table, with what each backend offers.
//!
//! | backend | URL | feature | fencing token | semaphores | read-write locks |
//! |---|---|---|---|---|---|
//! | [`memory::MemoryBackend`] | `memory://` | always | per-process counter | yes | yes |
//! | [`redis::RedisBackend`] | `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://` | `redis` (default), `tls` | per-key counter | yes | yes |
//! | [`redlock::RedlockBackend`] | `redlock://h1:port,h2:port,h3:port` | `redlock` | none (see its docs) | no | no |
//! | `etcd::EtcdBackend` | `etcd://host:2379[,host:2379...]`, `etcds://` | `etcd`, `tls` for `etcds://` | the key's create revision | yes | not yet |
//! | `zookeeper::ZooKeeperBackend` | `zk://host:port[,host:port...][/chroot]` | `zookeeper` | the lock node's `czxid` | yes | yes (Curator's `InterProcessReadWriteLock` layout) |

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;
