//! The conformance suite on the in-process backend.

use dlock_tests::fixtures::memory::MemoryFixture;

dlock_tests::conformance_suite!(MemoryFixture::default());
dlock_tests::segments_suite!(MemoryFixture::default());
dlock_tests::semaphore_suite!(MemoryFixture::default());
dlock_tests::multi_suite!(MemoryFixture::default(), rounds = 500);
dlock_tests::rw_suite!(MemoryFixture::default());
dlock_tests::election_suite!(MemoryFixture::default());
dlock_tests::latch_suite!(MemoryFixture::default());
dlock_tests::barrier_suite!(MemoryFixture::default());
