//! The conformance suite on a three-node ZooKeeper ensemble on loopback.
//!
//! Each case starts its own ensemble (three JVMs); on a 2-core machine the
//! whole file takes about a minute.

use dlock_tests::fixtures::zookeeper::ZkFixture;

dlock_tests::conformance_suite!(ZkFixture::ensemble().await);
