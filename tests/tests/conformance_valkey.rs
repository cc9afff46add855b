//! The conformance suite on one Valkey 8.1 server, where lock renewals go
//! by `SET … IFEQ` instead of a script (see `redis_valkey.rs`).

use dlock_tests::fixtures::redis::RedisFixture;

dlock_tests::conformance_suite!(RedisFixture::valkey());
dlock_tests::segments_suite!(RedisFixture::valkey());
dlock_tests::semaphore_suite!(RedisFixture::valkey());
dlock_tests::rw_suite!(RedisFixture::valkey());
