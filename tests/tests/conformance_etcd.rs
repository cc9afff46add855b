//! The conformance suite on etcd: one member, and a 3-member cluster whose
//! URL names all members.

mod single {
    use dlock_tests::fixtures::etcd::EtcdFixture;

    dlock_tests::conformance_suite!(EtcdFixture::single());
    // Segments are ordinary locks: etcd has them.
    dlock_tests::segments_suite!(EtcdFixture::single());
    dlock_tests::semaphore_suite!(EtcdFixture::single());
    dlock_tests::multi_suite!(EtcdFixture::single(), rounds = 500);
    dlock_tests::rw_suite!(EtcdFixture::single());
}

mod cluster {
    use dlock_tests::fixtures::etcd::EtcdFixture;

    dlock_tests::conformance_suite!(EtcdFixture::cluster(3));
}
