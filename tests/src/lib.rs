//! dlock's conformance suite, the fixtures that run it, the server harness
//! and the fault proxy. Everything here runs against real servers that the
//! tests start themselves.

pub mod conformance;
pub mod error;
pub mod etcd_recipe;
pub mod fixtures;
pub mod foreign;
pub mod holder;
pub mod multi;
pub mod nesting;
pub mod ordinary_code;
pub mod overlap;
pub mod proxy;
pub mod rw;
pub mod segments;
pub mod semaphore;
pub mod servers;
pub mod shared;
pub mod tls;
