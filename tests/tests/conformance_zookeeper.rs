//! The conformance suite on one standalone ZooKeeper server.

use dlock_tests::fixtures::zookeeper::ZkFixture;

dlock_tests::conformance_suite!(ZkFixture::start().await);
// Segments are ordinary locks: ZooKeeper has them.
dlock_tests::segments_suite!(ZkFixture::start().await);
dlock_tests::semaphore_suite!(ZkFixture::start().await);
dlock_tests::multi_suite!(ZkFixture::start().await, rounds = 500);
dlock_tests::rw_suite!(ZkFixture::start().await);
