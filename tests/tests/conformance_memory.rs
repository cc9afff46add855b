//! The conformance suite on the in-process backend.

use dlock_tests::fixtures::memory::MemoryFixture;

dlock_tests::conformance_suite!(MemoryFixture::default());
