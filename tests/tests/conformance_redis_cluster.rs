//! The conformance suite on a three-master Redis Cluster.

use dlock_tests::fixtures::redis::RedisFixture;

dlock_tests::conformance_suite!(RedisFixture::cluster());
dlock_tests::semaphore_suite!(RedisFixture::cluster());
dlock_tests::barrier_suite!(RedisFixture::cluster());
dlock_tests::multi_suite!(RedisFixture::cluster(), rounds = 500);
dlock_tests::rw_suite!(RedisFixture::cluster());
dlock_tests::election_suite!(RedisFixture::cluster());
dlock_tests::latch_suite!(RedisFixture::cluster());
