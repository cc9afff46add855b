//! Real servers started by the tests themselves, on free loopback ports with temp data dirs,
//! stopped on drop.

pub mod control;
pub mod ports;
pub mod process;
pub mod redis;

pub use control::ServerControl;
pub use redis::{RedisCluster, RedisOptions, RedisServer, RedisSet};
