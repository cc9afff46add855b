//! Real servers started by the tests themselves, on free loopback ports with temp data dirs,
//! stopped on drop.
//!
//! | kind | start | address for dlock |
//! |---|---|---|
//! | one Redis | [`RedisServer::start`], [`RedisServer::start_with`] (ACL user, password), [`RedisServer::start_tls`] | `url()`: `redis://` / `rediss://` |
//! | Redlock set | [`RedisSet::start`] | `url()`: `redlock://a,b,c` |
//! | Redis Cluster | [`RedisCluster::start`] | `url()`: `redis+cluster://a,b,c` |
//! | Redis Sentinel (master, replicas, 3 sentinels) | [`RedisSentinel::start`], [`RedisSentinel::try_start_with`] (auth, sentinel password, AOF, timings) | `url()`: `redis+sentinel://a,b,c/mm` |
//! | one etcd member | [`EtcdServer::start`], [`EtcdServer::start_tls`] | `url()`: `etcd://` / `etcds://` |
//! | etcd cluster | [`EtcdCluster::start`] | `url()`: `etcd://a,b,c` |
//! | ZooKeeper | [`ZkServer::start`], [`ZkServer::start_with`] (tick time, session bounds) | `url()`: `zk://` |
//! | PostgreSQL | [`PgServer::start`] (run as the `postgres` user when the tests run as root) | `url()`: `postgres://` |
//! | PgBouncer in front of a PostgreSQL | [`PgBouncer::start`] (`pool_mode` per test, `default_pool_size = 2`, run as `postgres` under root) | `url()`: `postgres://` |
//! | MariaDB | [`MariaDbServer::start`] (run as the `mysql` user when the tests run as root) | `url()`: `mysql://` |
//! | ZooKeeper ensemble | [`ZkEnsemble::start`] | `url()`: `zk://a,b,c` |
//!
//! Each `start` panics with a readable message when the server cannot start (a missing binary
//! names the apt command and `scripts/install-deps.sh`); each has a `try_` twin returning
//! [`crate::error::HarnessResult`]. Every single server implements [`ServerControl`]
//! (`kill9`, `stop`, `start_again`, `restart`, `pause`, `resume`, `pid`); groups hand out
//! their members (`server_mut(i)`, `node_mut(i)`, `member_mut(i)`) for that.
//!
//! The calls are synchronous and block for at most their bounded readiness wait (Redis tens
//! of ms, etcd about 0.5 s, ZooKeeper about 1 s). From a current-thread `#[tokio::test]`,
//! that freezes the test's other tasks meanwhile (a dlock watchdog, say); where that matters,
//! use `#[tokio::test(flavor = "multi_thread")]` and wrap the call in
//! `tokio::task::block_in_place`.
//!
//! ```no_run
//! use dlock_tests::servers::{RedisServer, ServerControl};
//!
//! let mut redis = RedisServer::start();
//! let url = redis.url(); // redis://127.0.0.1:PORT
//! assert_eq!(redis.redis_cli(&["PING"]), "PONG");
//! redis.kill9(); // crash
//! redis.start_again(); // same port, ready again
//! # drop(url);
//! ```

mod accessors;
pub mod control;
pub mod etcd;
mod leader;
pub mod mariadb;
pub mod pgbouncer;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod redis;
pub mod sentinel;
mod system_user;
pub mod zookeeper;

pub use control::ServerControl;
pub use etcd::{EtcdCluster, EtcdServer};
pub use mariadb::MariaDbServer;
pub use pgbouncer::PgBouncer;
pub use postgres::PgServer;
pub use redis::{RedisCluster, RedisOptions, RedisServer, RedisSet};
pub use sentinel::{RedisSentinel, SentinelNode, SentinelOptions};
pub use zookeeper::{ZkEnsemble, ZkOptions, ZkServer};
