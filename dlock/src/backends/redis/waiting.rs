//! Floor 4b of the Redis backend, above `calls`: waiting in line, made of
//! requests. The subscriber (channels, keyspace events, a waiter's turn:
//! `subscriber.rs`, `subscriber/turn.rs`) and the one wait loop
//! (`subscriber/waiting.rs`), the server-side queue of a lock's waiters
//! (`waiter_queue.rs`) and the heartbeat that keeps its tickets alive
//! (`turns.rs`), and the re-check (`recheck.rs`: its schedule, its `PTTL`,
//! the keyspace channel).
//!
//! May use: `config`, `protocol`, `transport`, `topology`, `calls`.

pub(crate) mod recheck;
pub(crate) mod subscriber;
pub(crate) mod turns;
pub(crate) mod waiter_queue;
