//! No span or event costs a heap allocation when no subscriber is
//! interested. Counted with an instrumented global allocator around one
//! emission of every span, event and metric dlock has.
//!
//! Without the `metrics` feature only: with it, each `metrics` macro builds
//! its key on the heap whether or not a recorder is installed (that cost is
//! the feature's, and `dlock::guide::observability` says so). `scripts/test.sh` runs this file
//! in the build without features.
#![cfg(not(feature = "metrics"))]

use std::alloc::System;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn nothing_allocates_when_nobody_listens() {
    // Once to register every callsite's interest (tracing caches it).
    dlock::__private::observe_everything_once();
    let region = Region::new(GLOBAL);
    for _ in 0..10 {
        dlock::__private::observe_everything_once();
    }
    let change = region.change();
    assert_eq!(
        change.allocations, 0,
        "spans and events allocated {} times ({} bytes) with no subscriber",
        change.allocations, change.bytes_allocated
    );
}
