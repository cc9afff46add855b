//! The backends, one module each; all but `memory` sit behind a cargo feature.
//!
//! [`connect`](crate::connect) finds a URL's backend in one table of
//! scheme → backend, feature, semaphores and read-write locks (`backend/schemes.rs`); this is that
//! table, with what each backend offers.
//!
//! | backend | URL | feature | fencing token | semaphores | read-write locks |
//! |---|---|---|---|---|---|
//! | [`memory::MemoryBackend`] | `memory://` | always | per-process counter | yes | yes |
//! | [`redis::RedisBackend`] | `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`, `redis+sentinel://`, `rediss+sentinel://` | `redis` (default), `tls` | per-key counter | yes | yes (single server, Cluster and Sentinel) |
//! | [`redis::redisson::RedissonBackend`] | any Redis URL with `?layout=redisson` | `redis` | `RFencedLock`'s counter | no | no (see [interop](crate::guide::interop)) |
//! | [`redlock::RedlockBackend`] | `redlock://h1:port,h2:port,h3:port` | `redlock` | none (see its docs) | no | no |
//! | `etcd::EtcdBackend` | `etcd://host:2379[,host:2379...]`, `etcds://` | `etcd`, `tls` for `etcds://` | the key's create revision | yes | yes (etcd's recipe `RWMutex` layout) |
//! | `postgres::PostgresBackend` | `postgres://[user[:password]@]host[:port][,host[:port]...][/dbname]`, `postgresql://` (libpq URL syntax) | `postgres` | a per-key counter row | yes (N slot advisory locks) | yes (shared advisory locks, a writer-intent key) |
//! | `mysql::MysqlBackend` | `mysql://user[:password]@host[:port]/database`, `mysqls://` (TLS) | `mysql` | a per-name counter row | yes (N slot named locks) | no (`GET_LOCK` has no shared mode) |
//! | `file::FileBackend` | `file:///absolute/dir` (Linux) | `file` | a counter file beside the lock file, `max(last + 1, clock in µs)` | yes (N slot files) | yes (`flock` shared/exclusive, a gate file for waiting writers) |
//! | `zookeeper::ZooKeeperBackend` | `zk://host:port[,host:port...][/chroot]`, `zks://` | `zookeeper`, `tls` for `zks://` | the lock node's `czxid` | yes | yes (Curator's `InterProcessReadWriteLock` layout) |
//!
//! Every backend takes a [`MultiLock`](crate::MultiLock)'s keys; a single
//! Redis server takes them all in one script
//! ([`AllKeysBackend`](crate::backend::AllKeysBackend)), the others one by
//! one in canonical order.
//!
//! Leader election ([`Election`](crate::Election),
//! [`ElectionBackend`](crate::backend::ElectionBackend)) runs on memory,
//! Redis (single server, Cluster and Sentinel), etcd (in the layout of
//! etcd's `concurrency.Election`, so `etcdctl elect` takes part),
//! ZooKeeper (Curator's `LeaderLatch`), PostgreSQL (the advisory lock
//! of the name) and the file backend (the lock file of the name, the
//! leader's record beside it); Redlock and MySQL (no server notification a
//! watch could wait on) refuse it with
//! [`no_elections`](crate::backend::no_elections).

pub(crate) mod announcements;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
pub(crate) mod fence_retention;
#[cfg(all(feature = "file", target_os = "linux"))]
pub mod file;
#[cfg(any(
    feature = "postgres",
    feature = "zookeeper",
    feature = "mysql",
    all(feature = "file", target_os = "linux")
))]
pub(crate) mod held_deadline;
#[cfg(all(test, any(feature = "etcd", feature = "zookeeper")))]
pub(crate) mod long_key_lease;
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sessions;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod shared_watches;

#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;
