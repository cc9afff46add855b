//! The conformance suite, and the segment, semaphore, multi-key and
//! read-write suites, on a `redis+sentinel://` URL: each case starts its own
//! master, replica and three sentinels, so every grant and renewal also
//! waits for the replica's acknowledgement (the default `replicas=auto`).

use dlock_tests::fixtures::sentinel::SentinelFixture;

/// A fresh deployment; started off the runtime's worker (the harness waits
/// for the sentinels to know each other).
fn fixture() -> SentinelFixture {
    tokio::task::block_in_place(SentinelFixture::start)
}

dlock_tests::conformance_suite!(fixture());
dlock_tests::segments_suite!(fixture());
dlock_tests::semaphore_suite!(fixture());
dlock_tests::barrier_suite!(fixture());
dlock_tests::multi_suite!(fixture(), rounds = 500);
dlock_tests::rw_suite!(fixture());
dlock_tests::election_suite!(fixture());
dlock_tests::latch_suite!(fixture());
