//! Floor 4 of the Redis backend, beside `calls`: waiting in line. The
//! subscriber (channels, keyspace events, a waiter's turn: `subscriber.rs`,
//! `subscriber/turn.rs`) and the one wait loop (`subscriber/waiting.rs`),
//! the server-side queue of a lock's waiters (`waiter_queue.rs`) and the
//! heartbeat that keeps its tickets alive (`turns.rs`), the re-check cap
//! (`recheck.rs`), and a lock's wait riding through failures
//! (`ride_through.rs`).
//!
//! May use: `config`, `protocol`, `transport`, `topology`.

pub(crate) mod recheck;
pub(crate) mod ride_through;
pub(crate) mod subscriber;
pub(crate) mod turns;
pub(crate) mod waiter_queue;
