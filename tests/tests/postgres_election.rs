//! PostgreSQL leader election with leaders in processes of their own: a
//! leader process paused (SIGSTOP) is replaced once the server ends its
//! silent session (`?session_timeout=2s`), and a killed one at once, its
//! connection being closed (`election_process_suite!`).

use dlock_tests::fixtures::postgres::PgFixture;

dlock_tests::election_process_suite!(PgFixture::start(), env!("CARGO_BIN_EXE_election-candidate"));
