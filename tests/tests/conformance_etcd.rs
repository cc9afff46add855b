//! The conformance suite on etcd: one member, and a 3-member cluster whose
//! URL names all members.

mod single {
    use dlock_tests::fixtures::etcd::EtcdFixture;

    dlock_tests::conformance_suite!(EtcdFixture::single());
    // Segments are ordinary locks: etcd has them.
    dlock_tests::segments_suite!(EtcdFixture::single());
    dlock_tests::semaphore_suite!(EtcdFixture::single());

    // Until `nested_keys_are_independent` joins `conformance_suite!`'s cases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nested_keys_are_independent() {
        dlock_tests::nesting::nested_keys_are_independent(&EtcdFixture::single()).await;
    }
}

mod cluster {
    use dlock_tests::fixtures::etcd::EtcdFixture;

    dlock_tests::conformance_suite!(EtcdFixture::cluster(3));
}
