//! dlock's conformance suite, the fixtures that run it, the server harness,
//! the fault proxy, and other libraries' lock clients (Curator, redis-py)
//! for the interop tests. Everything here runs against real servers that
//! the tests start themselves.

pub mod acquisitions;
pub mod barrier;
pub mod candidates;
pub mod captured_log;
pub mod conformance;
pub mod curator;
pub mod election;
pub mod election_processes;
pub mod error;
pub mod etcd_recipe;
pub mod failover;
pub mod fixtures;
pub mod foreign;
pub mod hold_at_least;
pub mod holder;
pub mod keys;
pub mod latch;
pub mod late_answer;
pub mod layout_mix;
pub mod loss_heard;
pub mod multi;
pub mod multi_live;
pub mod nesting;
pub mod operations;
pub mod ordinary_code;
pub mod overlap;
pub mod paused_holder;
pub mod poll;
pub mod proxy;
pub mod redisson;
pub mod redisson_cases;
pub mod rw;
pub mod rw_crash;
pub mod segments;
pub mod semaphore;
pub mod servers;
pub mod shared;
pub mod short_waits;
pub mod sql_servers;
pub mod tls;
pub mod urls;

/// The README's code blocks, compiled (and run, where no server is needed)
/// as this crate's doctests, so the front page cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod readme {}
