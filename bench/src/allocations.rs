//! Heap allocations counted for the whole process (every thread: the
//! caller's runtime, dlock's background thread, the client libraries'), so
//! that the bench can print allocations per cycle beside its other figures.
//!
//! The counting allocator is the process's global allocator wherever this
//! crate is linked (the `bench` and `profile` binaries): `stats_alloc`
//! wraps the system allocator with a few relaxed atomic additions per call.

use std::alloc::System;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations so far in this process: `alloc` calls plus `realloc` calls
/// (a grown `Vec` or `String` is a new allocation to the allocator).
pub fn count() -> u64 {
    let stats = ALLOCATOR.stats();
    (stats.allocations + stats.reallocations) as u64
}

/// Allocations per cycle between two [`count`]s.
pub fn per_cycle(before: u64, after: u64, cycles: f64) -> f64 {
    after.saturating_sub(before) as f64 / cycles
}
