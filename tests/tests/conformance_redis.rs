//! The conformance suite on one Redis server, reached as an ACL user with
//! exactly the minimal grant of dlock::guide::backends (`RedisFixture::restricted`).

use dlock_tests::fixtures::redis::RedisFixture;

dlock_tests::conformance_suite!(RedisFixture::restricted());
dlock_tests::segments_suite!(RedisFixture::restricted());
dlock_tests::semaphore_suite!(RedisFixture::restricted());
dlock_tests::barrier_suite!(RedisFixture::restricted());
dlock_tests::multi_suite!(RedisFixture::restricted(), rounds = 500);
dlock_tests::rw_suite!(RedisFixture::restricted());
dlock_tests::election_suite!(RedisFixture::restricted());
dlock_tests::latch_suite!(RedisFixture::restricted());
