//! The conformance suite on MySQL (MariaDB 10.11): one throwaway server per
//! test, dlock connected as root with the default options.

use dlock_tests::fixtures::mysql::MysqlFixture;

dlock_tests::conformance_suite!(MysqlFixture::start());
// Segments are ordinary locks: MySQL has them.
dlock_tests::segments_suite!(MysqlFixture::start());
dlock_tests::multi_suite!(MysqlFixture::start(), rounds = 200);
