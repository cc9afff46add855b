//! Interop with `etcdctl lock` both ways, and escaped key names.

use super::*;

/// `etcdctl lock <name>` as a child process; it prints the key it holds
/// once it has the lock, and gives it back on SIGTERM.
pub(crate) struct Etcdctl {
    child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Etcdctl {
    pub(crate) fn lock(endpoints: &str, name: &str) -> Self {
        let ctl = require_binary("etcdctl", ETCD_PACKAGES).unwrap_or_else(|e| panic!("{e}"));
        let mut child = Command::new(ctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["lock", name])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn etcdctl lock");
        let stdout = child.stdout.take().expect("piped stdout");
        Etcdctl {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The key etcdctl printed when it got the lock, if it did within `limit`.
    pub(crate) async fn acquired_within(&mut self, limit: Duration) -> Option<String> {
        match tokio::time::timeout(limit, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Some(line),
            Ok(other) => panic!("etcdctl lock ended without the lock: {other:?}"),
            Err(_) => None,
        }
    }

    /// SIGTERM: etcdctl unlocks and revokes its session, then exits (bounded).
    pub(crate) async fn unlock(mut self) {
        let pid = self.child.id().expect("etcdctl is running") as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("signal etcdctl");
        tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .expect("etcdctl did not exit within 5 s of SIGTERM")
            .expect("wait for etcdctl");
    }
}

/// While we hold `key`, `etcdctl lock <name>` waits (1.5 s); after our
/// release it gets the lock (within 5 s). Returns etcdctl, holding it, and
/// the key it printed.
async fn etcdctl_gets_it_after_our_release(
    ours: &Arc<dyn LockBackend>,
    key: &str,
    endpoints: &str,
    name: &str,
) -> (Etcdctl, String) {
    let guard = lock(ours, key).acquire().await.unwrap();
    let mut theirs = Etcdctl::lock(endpoints, name);
    assert_eq!(
        theirs.acquired_within(Duration::from_millis(1500)).await,
        None,
        "etcdctl got the lock while we held it"
    );
    guard.release().await.unwrap();
    let their_key = theirs
        .acquired_within(Duration::from_secs(5))
        .await
        .expect("etcdctl did not get the lock after our release");
    (theirs, their_key)
}

/// While we hold `order:42`, `etcdctl lock dlock/order:42` waits; after our
/// release it gets the lock; then we wait for it, and get the lock when it
/// lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excludes_and_follows_etcdctl_lock_both_ways() {
    let fixture = EtcdFixture::single();
    let endpoints = fixture.url().trim_start_matches("etcd://").to_owned();
    let key = "order:42";
    let name = queue_prefix(key).trim_end_matches('/').to_owned();
    let ours = connect(fixture.url()).await;

    let (theirs, their_key) =
        etcdctl_gets_it_after_our_release(&ours, key, &endpoints, &name).await;
    assert!(their_key.starts_with(&queue_prefix(key)), "{their_key}");

    // Now etcdctl holds it: we neither get it at once nor within a short wait.
    assert!(lock(&ours, key).try_acquire().await.unwrap().is_none());
    let err = lock(&ours, key)
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let waiting = wait_for(lock(&ours, key).wait(Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let let_go = Instant::now();
    theirs.unlock().await;
    let guard = got_within(
        waiting,
        let_go,
        Duration::from_secs(2),
        "we did not get the lock after etcdctl let go",
    )
    .await;
    guard.release().await.unwrap();
}

/// A key with `/` is the `etcdctl lock` of its escaped name
/// (`dlock/tenant%2F7`), which `queue_prefix` gives: etcdctl waits while we
/// hold it and gets it after our release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_a_slash_is_the_etcdctl_lock_of_its_escaped_name() {
    let fixture = EtcdFixture::single();
    let endpoints = fixture.url().trim_start_matches("etcd://").to_owned();
    let key = "tenant/7";
    let etcd = EtcdBackend::connect(fixture.url()).await.unwrap();
    assert_eq!(etcd.queue_prefix(key), "dlock/tenant%2F7/");
    let ours: Arc<dyn LockBackend> = Arc::new(etcd);

    let (theirs, their_key) =
        etcdctl_gets_it_after_our_release(&ours, key, &endpoints, "dlock/tenant%2F7").await;
    assert!(their_key.starts_with("dlock/tenant%2F7/"), "{their_key}");
    assert!(lock(&ours, key).try_acquire().await.unwrap().is_none());
    theirs.unlock().await;
}
