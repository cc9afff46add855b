//! Floor 3 of the Redis backend: where the servers are. Sentinel (finding
//! and following the master, `sentinel.rs`, and the replicas it lists,
//! `sentinel/listed.rs`), what a one-server backend talks to (`server.rs`:
//! one connection or the master a Sentinel names), and the replicas a
//! grant waits for (`replicas.rs`, counted in `replicas/count.rs`), and
//! whether a server may evict lock keys (`eviction.rs`).
//!
//! May use: `config`, `protocol`, `transport`.

pub(crate) mod eviction;
pub(crate) mod replicas;
pub(crate) mod sentinel;
pub(crate) mod server;
