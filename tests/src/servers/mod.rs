//! Real servers started by the tests themselves, on free loopback ports with temp data dirs,
//! stopped on drop.

pub mod control;
pub mod etcd;
pub mod ports;
pub mod process;
pub mod redis;
pub mod zookeeper;

pub use control::ServerControl;
pub use etcd::{EtcdCluster, EtcdServer};
pub use redis::{RedisCluster, RedisOptions, RedisServer, RedisSet};
pub use zookeeper::{ZkEnsemble, ZkOptions, ZkServer};
