//! The conformance suite on one standalone ZooKeeper server.

use dlock_tests::fixtures::zookeeper::ZkFixture;

dlock_tests::conformance_suite!(ZkFixture::start().await);
// Segments are ordinary locks: ZooKeeper has them.
dlock_tests::segments_suite!(ZkFixture::start().await);
dlock_tests::semaphore_suite!(ZkFixture::start().await);
dlock_tests::multi_suite!(ZkFixture::start().await, rounds = 500);
dlock_tests::rw_suite!(ZkFixture::start().await);
dlock_tests::election_suite!(ZkFixture::start().await);
dlock_tests::barrier_suite!(ZkFixture::start().await);
dlock_tests::latch_suite!(ZkFixture::start().await);

/// The same suites with digest credentials and the default ACL
/// (`creator_read`): dlock needs nothing more than its own identity owning
/// the nodes it creates (dlock::guide::backends, "Permissions").
mod with_credentials {
    use dlock_tests::fixtures::zookeeper::ZkFixture;

    dlock_tests::conformance_suite!(ZkFixture::with_credentials().await);
    dlock_tests::semaphore_suite!(ZkFixture::with_credentials().await);
    dlock_tests::rw_suite!(ZkFixture::with_credentials().await);
    dlock_tests::election_suite!(ZkFixture::with_credentials().await);
    dlock_tests::barrier_suite!(ZkFixture::with_credentials().await);
    dlock_tests::latch_suite!(ZkFixture::with_credentials().await);
}
