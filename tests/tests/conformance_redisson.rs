//! The conformance suite on Redisson's layout (`?layout=redisson`), on one
//! Redis server and on a three-master Redis Cluster. Fencing is
//! `RFencedLock`'s counter, so the fencing cases run as on every fencing
//! backend.

use dlock_tests::fixtures::redisson::RedissonFixture;

mod single {
    use super::*;
    dlock_tests::conformance_suite!(RedissonFixture::single());
    dlock_tests::latch_suite!(RedissonFixture::single());
}

mod cluster {
    use super::*;
    dlock_tests::conformance_suite!(RedissonFixture::cluster());
    dlock_tests::latch_suite!(RedissonFixture::cluster());
}
