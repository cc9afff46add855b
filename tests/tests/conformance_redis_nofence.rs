//! The conformance suite on one Redis server with `?fence=off`: plain
//! locks without fencing tokens (`fencing_token()` is `None`, which the
//! suite's fence checks expect of a fixture whose `fencing()` is false),
//! reached as the ACL user with the minimal grant, as `conformance_redis.rs`.

use dlock_tests::fixtures::redis::RedisFixture;

dlock_tests::conformance_suite!(RedisFixture::restricted().without_fence());
dlock_tests::multi_suite!(RedisFixture::restricted().without_fence(), rounds = 200);
