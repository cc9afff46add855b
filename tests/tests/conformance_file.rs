//! The conformance suite on the file backend: a temporary directory per
//! test, every client a backend of its own on it.
#![cfg(target_os = "linux")]

use dlock_tests::fixtures::file::FileFixture;

dlock_tests::conformance_suite!(FileFixture::start());
// Segments and several keys are ordinary locks, key by key.
dlock_tests::segments_suite!(FileFixture::start());
dlock_tests::multi_suite!(FileFixture::start(), rounds = 200);
// Readers share `flock(LOCK_SH)`, writers take `LOCK_EX` behind a gate file.
dlock_tests::rw_suite!(FileFixture::start());
// A permit is `flock(LOCK_EX)` on one of N slot files; holders keep the
// count file shared.
dlock_tests::semaphore_suite!(FileFixture::start());
// Elections are the lock of their name, the record in `<prefix>~<name>.leader`.
dlock_tests::election_suite!(FileFixture::start());
// A latch is the count file `<prefix>~latch~<name>.count`, woken by inotify.
dlock_tests::latch_suite!(FileFixture::start());
// A barrier member is a locked, leased file `<prefix>~barrier~<name>~<id>.member`.
dlock_tests::barrier_suite!(FileFixture::start());
