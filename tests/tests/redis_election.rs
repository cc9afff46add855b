//! Redis leader election as the server sees it: the record and the channel
//! by name and content, no expiry on the record and nothing left after a
//! resignation, a dead record removed by the next read, the channel of a
//! database other than 0, and an observer that sends no request while
//! nothing changes (woken by pub/sub, not polling).
//!
//! Also the liveness of leader processes paused past their ttl and
//! resumed, or killed (`election_process_suite!`).

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::redis::RedisBackend;
use dlock::{Election, Leader, LockBackend};
use dlock_tests::fixtures::redis::RedisFixture;
use dlock_tests::servers::redis::RedisServer;
use futures_util::StreamExt;

async fn redis(url: &str) -> Arc<RedisBackend> {
    Arc::new(RedisBackend::connect(url).await.expect("connect"))
}

fn election(backend: &Arc<RedisBackend>, name: &str) -> Election {
    let backend: Arc<dyn LockBackend> = backend.clone();
    Election::new(name).with_backend(backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_and_the_channel_key_by_key() {
    let fixture = RedisFixture::single();
    let (a, b) = (redis(fixture.url()).await, redis(fixture.url()).await);
    let leadership = election(&a, "scheduler")
        .campaign("node-a:8080")
        .await
        .unwrap();
    let term = leadership.term();
    let record = fixture.redis_cli(&["GET", "dlock:{scheduler}:leader"]);
    let token = fixture.redis_cli(&["GET", "dlock:{scheduler}"]);
    assert_eq!(record, format!("{token}\n{term}\nnode-a:8080"));
    assert_eq!(
        fixture.redis_cli(&["GET", "dlock:{scheduler}:fence"]),
        term.to_string(),
        "the term is the lock's fence"
    );
    assert_eq!(
        fixture.redis_cli(&["PTTL", "dlock:{scheduler}:leader"]),
        "-1",
        "the record has no expiry of its own"
    );
    assert_eq!(
        fixture.redis_cli(&["PUBSUB", "NUMSUB", "dlock:{scheduler}:elected"]),
        "dlock:{scheduler}:elected\n0"
    );
    let mut changes = election(&b, "scheduler").observe();
    assert!(changes.next().await.unwrap().is_some());
    assert_eq!(
        fixture.redis_cli(&["PUBSUB", "NUMSUB", "dlock:{scheduler}:elected"]),
        "dlock:{scheduler}:elected\n1",
        "the observer listens on the election's channel"
    );

    // An observer that waits sends nothing: it is woken by the channel.
    let before = b.metrics().round_trips;
    let idle = tokio::time::timeout(Duration::from_secs(2), changes.next()).await;
    assert!(idle.is_err(), "a change was reported while nothing changed");
    assert_eq!(b.metrics().round_trips, before, "the observer polled");

    leadership.resign().await.unwrap();
    assert_eq!(changes.next().await, Some(None));
    assert_eq!(
        fixture.redis_cli(&["EXISTS", "dlock:{scheduler}:leader"]),
        "0"
    );
    assert_eq!(fixture.redis_cli(&["EXISTS", "dlock:{scheduler}"]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_record_is_shown_to_nobody_and_removed_by_the_next_read() {
    let fixture = RedisFixture::single();
    let a = redis(fixture.url()).await;
    let leadership = election(&a, "compactor").campaign("node-a").await.unwrap();
    // The lease goes behind the leader's back (an operator, an expiry):
    // the record stays until someone reads it.
    fixture.redis_cli(&["DEL", "dlock:{compactor}"]);
    assert_eq!(
        fixture.redis_cli(&["EXISTS", "dlock:{compactor}:leader"]),
        "1"
    );
    assert_eq!(election(&a, "compactor").leader().await.unwrap(), None);
    assert_eq!(
        fixture.redis_cli(&["EXISTS", "dlock:{compactor}:leader"]),
        "0"
    );
    drop(leadership);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_n_has_its_own_channel() {
    let server = RedisServer::start();
    let url = format!("{}/3", server.url());
    let (a, b) = (redis(&url).await, redis(&url).await);
    let mut changes = election(&b, "scheduler").observe();
    assert_eq!(changes.next().await, Some(None));
    assert_eq!(
        server.redis_cli(&["PUBSUB", "NUMSUB", "dlock:{scheduler}:elected:db3"]),
        "dlock:{scheduler}:elected:db3\n1"
    );
    let leadership = election(&a, "scheduler").campaign("node-a").await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .unwrap();
    assert_eq!(
        seen,
        Some(Some(Leader {
            value: "node-a".into(),
            term: leadership.term()
        }))
    );
    leadership.resign().await.unwrap();
}

dlock_tests::election_process_suite!(
    RedisFixture::single(),
    env!("CARGO_BIN_EXE_election-candidate")
);
