//! The conformance suite (fencing: none, as promised) on five independent
//! Redis masters through the Redlock backend.

use dlock_tests::fixtures::redlock::RedlockFixture;

dlock_tests::conformance_suite!(RedlockFixture::start(5));
dlock_tests::multi_suite!(RedlockFixture::start(5), rounds = 500);
