//! The conformance suite (fencing: none, as promised) on five independent
//! Redis masters through the Redlock backend.

use dlock_tests::fixtures::redlock::RedlockFixture;

dlock_tests::conformance_suite!(RedlockFixture::start(5));
dlock_tests::multi_suite!(RedlockFixture::start(5), rounds = 500);

/// Redlock has no leader election (no fencing token to be the term): a
/// clear refusal that names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_are_refused() {
    dlock_tests::election::elections_are_refused_on(&RedlockFixture::start(3)).await;
}
