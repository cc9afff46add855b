//! Leader announcements are hints, not facts: a client that may `PUBLISH`
//! on a Redis election's channel, or a PostgreSQL role that may `NOTIFY
//! dlock_elected`, announces a leader nobody elected with a huge term and a
//! resignation of the live leader. Observers show neither, and still report
//! the real leader's resignation and its successor's term.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::postgres::advisory_key;
use dlock::{Election, Leader, LockBackend};
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::postgres::PgFixture;
use dlock_tests::fixtures::redis::RedisFixture;
use futures_util::{Stream, StreamExt};

const HUGE: u64 = 999_999_999;

/// A term far above any real one (Redis's terms may exceed [`HUGE`]).
fn far_above(term: u64) -> u64 {
    term.saturating_mul(2).max(HUGE)
}

/// The next item of an observer, within 10 s.
async fn next(changes: &mut (impl Stream<Item = Option<Leader>> + Unpin)) -> Option<Leader> {
    tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("an observed change within 10 s")
        .expect("the stream goes on")
}

/// Runs the scenario on `backend`: `forge(term_of_live_leader)` sends the
/// forged announcements (an election of `attacker` with term 999999999, and
/// the end of the live leader's term) while `leader` leads.
async fn forged_announcements_change_nothing(
    backend: Arc<dyn LockBackend>,
    name: &str,
    forge: impl Fn(u64),
) {
    let election = Election::new(name).with_backend(backend.clone());
    let mut changes = election.observe();
    assert_eq!(next(&mut changes).await, None, "nobody leads at first");
    let first = election.campaign("node-a").await.unwrap();
    let seen = next(&mut changes).await.expect("the real leader");
    assert_eq!((seen.value.as_str(), seen.term), ("node-a", first.term()));

    let first_term = first.term();
    forge(first_term);
    // Give the forgeries time to arrive before the real change.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        election.leader().await.unwrap().map(|l| l.term),
        Some(first_term),
        "the forgeries change no record"
    );
    first.resign().await.unwrap();
    assert_eq!(
        next(&mut changes).await,
        None,
        "the next item is the real resignation, not the forged leader"
    );
    let second = election.campaign("node-b").await.unwrap();
    let seen = next(&mut changes).await.expect("the next real leader");
    assert_eq!((seen.value.as_str(), seen.term), ("node-b", second.term()));

    // A replay of the first leader's genuine announcements shows nothing
    // either: the next item is the second leader's resignation.
    forge(first_term);
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.resign().await.unwrap();
    assert_eq!(next(&mut changes).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_announcements_on_redis_show_no_leader() {
    let fixture = RedisFixture::single();
    let backend = fixture.backend().await;
    let channel = "dlock:{forged}:elected";
    forged_announcements_change_nothing(backend, "forged", |term| {
        for message in [
            format!("{HUGE}\nattacker.example:8080"),
            format!("{}\nattacker.example:8080", far_above(term)),
            format!("-{term}"),
            format!("{term}\nnode-a"),
            format!("{}\nattacker.example:8080", term + 1),
        ] {
            fixture.redis_cli(&["PUBLISH", channel, &message]);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_announcements_on_postgres_show_no_leader() {
    let fixture = PgFixture::start();
    fixture
        .server()
        .psql("CREATE ROLE mallory LOGIN; GRANT CONNECT ON DATABASE postgres TO mallory");
    let backend = fixture.backend_for_tests().await;
    let key = advisory_key("forged");
    forged_announcements_change_nothing(backend, "forged", |term| {
        for message in [
            format!("{key}\n{HUGE}\nattacker.example:8080"),
            format!("{key}\n{}\nattacker.example:8080", far_above(term)),
            format!("{key}\n-{term}"),
            format!("{key}\n{term}\nnode-a"),
            format!("{key}\n{}\nattacker.example:8080", term + 1),
        ] {
            let sql = format!(
                "SET ROLE mallory; SELECT pg_notify('dlock_elected', '{}')",
                message.replace('\'', "''")
            );
            fixture.server().psql(&sql);
        }
    })
    .await;
}
