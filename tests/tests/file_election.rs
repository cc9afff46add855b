//! The file backend's elections with candidates in processes of their own
//! (`election_process_suite!`: a leader paused past its ttl, or killed),
//! and the leader's record beside the lock file: written with mode 0600,
//! shown only while the lock is held with its term, so a record written
//! by hand (or left by a dead leader) shows nobody.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use dlock::{Election, Leader};
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::file::FileFixture;

dlock_tests::election_process_suite!(
    FileFixture::start(),
    env!("CARGO_BIN_EXE_election-candidate")
);

/// The record is `<prefix>~<name>.leader`, mode 0600, with the term and
/// the value; a record forged for a term the lock is not held with shows
/// nobody, and the real leader's shows again once it proclaims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lock_holders_record_is_the_leader() {
    let fixture = FileFixture::start();
    let backend = fixture.backend().await;
    let observer = Election::new("primary").with_backend(fixture.backend().await);
    let leadership = Election::new("primary")
        .with_backend(backend)
        .campaign("node-a:8080")
        .await
        .unwrap();
    let term = leadership.term();
    let record = fixture.dir().join("dlock~primary.leader");
    let mode = std::fs::metadata(&record).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(
        text.ends_with(&format!("\nterm={term}\nvalue=node-a:8080")),
        "{text}"
    );
    assert_eq!(
        observer.leader().await.unwrap(),
        Some(Leader {
            value: "node-a:8080".into(),
            term
        })
    );
    // Another process writes a record of its own.
    let forged = text
        .replace(&format!("term={term}"), &format!("term={}", term + 1))
        .replace("node-a:8080", "evil:1");
    std::fs::write(&record, forged).unwrap();
    assert_eq!(
        observer.leader().await.unwrap(),
        None,
        "a record whose term is not the lock's fence"
    );
    leadership.proclaim("node-a:9090").await.unwrap();
    assert_eq!(
        observer.leader().await.unwrap(),
        Some(Leader {
            value: "node-a:9090".into(),
            term
        })
    );
    leadership.resign().await.unwrap();
    assert!(!record.exists(), "a resignation removes the record");
    assert_eq!(observer.leader().await.unwrap(), None);
}

/// A leader whose lock is let go without a resignation (its guard leaked
/// past the ttl, renewal off) leaves its record, which shows nobody; an
/// observer hears the end of the term without polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_leaders_record_shows_nobody() {
    use futures_util::StreamExt as _;
    let fixture = FileFixture::start();
    let observer = Election::new("lapsing").with_backend(fixture.backend().await);
    let mut changes = observer.observe();
    assert_eq!(changes.next().await, Some(None), "nobody leads at first");
    let leadership = Election::new("lapsing")
        .with_backend(fixture.backend().await)
        .ttl(Duration::from_millis(400))
        .renew(false)
        .campaign("short")
        .await
        .unwrap();
    let term = leadership.term();
    let next = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
    assert_eq!(
        next.unwrap(),
        Some(Some(Leader {
            value: "short".into(),
            term
        }))
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
    assert_eq!(
        ended.expect("the end of the term was not heard"),
        Some(None)
    );
    assert!(fixture.dir().join("dlock~lapsing.leader").exists());
    assert_eq!(observer.leader().await.unwrap(), None);
    drop(leadership);
}
