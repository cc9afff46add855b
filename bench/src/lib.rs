//! The benchmark suites of `cargo run --release -p dlock-bench --bin bench -- <url>`.
//!
//! Each suite measures dlock against a hand-written baseline on the same
//! server in the same run and prints ratios, because absolute numbers on a
//! shared machine mean little.

pub mod allocations;
pub mod cycle_suite;
pub mod etcd;
#[cfg(target_os = "linux")]
pub mod file;
pub mod first_handoff;
pub mod held;
pub mod mysql;
pub mod observed;
pub mod postgres;
pub mod postgres_held;
pub mod processes;
pub mod read_mostly;
pub mod redis;
pub mod redis_info;
pub mod redlock;
pub mod replicas;
pub mod rslock;
pub mod segments;
pub mod stats;
pub mod workloads;
pub mod zookeeper;
