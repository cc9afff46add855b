//! The conformance suite on one standalone ZooKeeper server.

use dlock_tests::fixtures::zookeeper::ZkFixture;

dlock_tests::conformance_suite!(ZkFixture::start().await);
