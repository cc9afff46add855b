//! The conformance suite on PostgreSQL: one throwaway server per test,
//! dlock connected as the superuser with the default options.

use dlock_tests::fixtures::postgres::PgFixture;

dlock_tests::conformance_suite!(PgFixture::start());
// Segments are ordinary locks: PostgreSQL has them.
dlock_tests::segments_suite!(PgFixture::start());
dlock_tests::multi_suite!(PgFixture::start(), rounds = 200);
dlock_tests::rw_suite!(PgFixture::start());
dlock_tests::semaphore_suite!(PgFixture::start());
// Elections are the lock of their name, the record in `dlock_leaders`.
dlock_tests::election_suite!(PgFixture::start());
dlock_tests::latch_suite!(PgFixture::start());
dlock_tests::barrier_suite!(PgFixture::start());
