//! ZooKeeper's ttl honesty (issue 46): a ttl longer than the session can
//! back (11/20 of the session timeout) is granted cut to that bound with a
//! WARN event, once per backend; the guard's `remaining()` and the
//! backend's `inspect`/`list` of the lock it holds show the lease's own
//! time left, not the session timeout.

use std::sync::Arc;
use std::time::Duration;

use dlock::backends::zookeeper::ZooKeeperBackend;
use dlock::{Lock, LockBackend};
use dlock_tests::captured_log::CapturedLog;
use dlock_tests::fixtures::zookeeper::{ZkFixture, SESSION_TIMEOUT};

const WARNING: &str = "ttl longer than the ZooKeeper session can back";

#[tokio::test(flavor = "current_thread")]
async fn a_ttl_beyond_the_session_is_cut_with_one_warning_and_inspect_shows_time_left() {
    let fixture = ZkFixture::start().await;
    let (captured, _default) = CapturedLog::at_level(tracing::Level::WARN);
    let backend: Arc<dyn LockBackend> =
        Arc::new(ZooKeeperBackend::connect(fixture.url()).await.unwrap());
    // 11/20 of the fixture's session timeout.
    let bound = SESSION_TIMEOUT / 20 * 11;

    // Within the bound: granted as asked, no warning.
    let fits = Lock::new("ttl:fits")
        .ttl(bound / 2)
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    assert!(!captured.text().contains(WARNING), "{}", captured.text());
    fits.release().await.unwrap();

    // Beyond it: granted, cut, and said so once.
    let asked = Duration::from_secs(120);
    let long = Lock::new("ttl:long")
        .ttl(asked)
        .with_backend(backend.clone());
    let guard = long.acquire().await.unwrap();
    let second = Lock::new("ttl:long-2")
        .ttl(asked)
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    let text = captured.text();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains(WARNING)).collect();
    assert_eq!(warnings.len(), 1, "one warning per backend:\n{text}");
    for field in [
        "WARN",
        "ttl_ms=120000",
        &format!("granted_ms={}", bound.as_millis()),
        "session_timeout",
    ] {
        assert!(warnings[0].contains(field), "{field} in {}", warnings[0]);
    }
    let left = guard.remaining();
    println!("asked {asked:?}, session timeout {SESSION_TIMEOUT:?}: remaining {left:?} (bound {bound:?})");
    assert!(left <= bound && left > Duration::ZERO, "{left:?}");

    // inspect and list show the lease's time left, not the session timeout.
    let info = long.inspect().await.unwrap().expect("held");
    println!("inspect: remaining {:?}", info.remaining);
    assert!(
        info.remaining <= bound,
        "{:?} is more than the lease's {bound:?}",
        info.remaining
    );
    assert!(info.remaining < SESSION_TIMEOUT);
    assert_eq!(info.fencing_token, guard.fencing_token());
    let listed = dlock::list_locks(&*backend, "ttl:").await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed.iter().all(|(_, info)| info.remaining <= bound),
        "{listed:?}"
    );
    guard.release().await.unwrap();
    second.release().await.unwrap();
}
