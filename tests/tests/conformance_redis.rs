//! The conformance suite on one Redis server.

use dlock_tests::fixtures::redis::RedisFixture;

dlock_tests::conformance_suite!(RedisFixture::single());
dlock_tests::segments_suite!(RedisFixture::single());
dlock_tests::semaphore_suite!(RedisFixture::single());
dlock_tests::multi_suite!(RedisFixture::single(), rounds = 500);
dlock_tests::rw_suite!(RedisFixture::single());
