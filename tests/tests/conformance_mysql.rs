//! The conformance suite on MySQL (MariaDB 10.11): one throwaway server per
//! test, dlock connected as root with the default options. Semaphores run
//! on slot locks (see `dlock::backends::mysql`).

use dlock_tests::fixtures::mysql::MysqlFixture;

dlock_tests::conformance_suite!(MysqlFixture::start());
// Segments are ordinary locks: MySQL has them.
dlock_tests::segments_suite!(MysqlFixture::start());
dlock_tests::multi_suite!(MysqlFixture::start(), rounds = 200);
// Semaphores: N slot locks, the count in dlock's table (`permits.rs`).
dlock_tests::semaphore_suite!(MysqlFixture::start());
