//! Floor 2 of the Redis backend: connections. One server's connection,
//! kept on dlock's runtime and one per multi-thread runtime that makes
//! requests (`connection.rs`, `lanes.rs`), a Cluster's (`cluster.rs`), and
//! the retiring of a connection whose request went unanswered
//! (`retiring.rs`).
//!
//! May use: `config`, `protocol`.

pub(crate) mod cluster;
pub(crate) mod connection;
pub(crate) mod lanes;
pub(crate) mod retiring;
