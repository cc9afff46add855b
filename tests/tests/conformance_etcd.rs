//! The conformance suite on etcd: one member with auth on, reached as a user
//! whose role has exactly the minimal grant of dlock::guide::backends
//! (`EtcdFixture::restricted`), and a 3-member cluster whose URL names all
//! members.

mod single {
    use dlock_tests::fixtures::etcd::EtcdFixture;

    dlock_tests::conformance_suite!(EtcdFixture::restricted());
    // Segments are ordinary locks: etcd has them.
    dlock_tests::segments_suite!(EtcdFixture::restricted());
    dlock_tests::semaphore_suite!(EtcdFixture::restricted());
    dlock_tests::multi_suite!(EtcdFixture::restricted(), rounds = 500);
    dlock_tests::rw_suite!(EtcdFixture::restricted());
    dlock_tests::election_suite!(EtcdFixture::restricted());
    dlock_tests::latch_suite!(EtcdFixture::restricted());
    dlock_tests::barrier_suite!(EtcdFixture::restricted());
}

mod cluster {
    use dlock_tests::fixtures::etcd::EtcdFixture;

    dlock_tests::conformance_suite!(EtcdFixture::cluster(3));
}
