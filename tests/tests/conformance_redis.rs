//! The conformance suite on one Redis server.

use dlock_tests::fixtures::redis::RedisFixture;

dlock_tests::conformance_suite!(RedisFixture::single());
