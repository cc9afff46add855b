//! A ZooKeeper lock holder process frozen (SIGSTOP) past its ttl but short
//! of its session timeout, then resumed: its session lives on, so only the
//! holder itself can delete its node. It does as soon as it runs again (its
//! lease is lost), and a waiting client is granted the lock within slack
//! of the resume, not when the session ends. The lock's side of the stale
//! node an election once kept for the rest of a session (issue 41).

use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend};
use dlock_tests::conformance::Fixture;
use dlock_tests::election_processes::LeaderProcessFixture;
use dlock_tests::fixtures::zookeeper::ZkFixture;
use dlock_tests::holder::{Holder, HolderSpec};
use dlock_tests::servers::process::freeze;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const HOLDER: &str = env!("CARGO_BIN_EXE_lock-holder");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_holder_frees_its_lost_lock_at_once() {
    const ROUNDS: usize = 3;
    let ttl = Duration::from_secs(2);
    let pause = Duration::from_secs(5);
    let fixture = ZkFixture::start().await;
    // 10 s sessions: the frozen holder's outlives the pause.
    let url = fixture.candidate_url();
    let backend: std::sync::Arc<dyn LockBackend> = fixture.backend().await;
    for round in 0..ROUNDS {
        let key = format!("paused-holder-{round}");
        let mut holder = Holder::spawn(
            HOLDER,
            &HolderSpec::once(&url, &key, ttl, Duration::from_secs(8)),
        );
        holder.acquired(Duration::from_secs(30)).await;
        let pid = holder.pid().expect("the holder runs");
        freeze(pid);
        let waiter = tokio::spawn({
            let lock = Lock::new(key.as_str())
                .with_backend(backend.clone())
                .wait(Duration::from_secs(30));
            async move { lock.acquire().await.map(|guard| (guard, Instant::now())) }
        });
        tokio::time::sleep(pause).await;
        let during = waiter.is_finished();
        kill(
            Pid::from_raw(i32::try_from(pid).expect("a pid fits in i32")),
            Signal::SIGCONT,
        )
        .expect("SIGCONT the holder");
        let resumed = Instant::now();
        let (guard, granted) = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("granted within 20 s of the resume")
            .expect("the waiter's task")
            .expect("the waiter's acquire");
        let after = granted.saturating_duration_since(resumed);
        eprintln!(
            "round {round}: the lock was granted {after:?} after the holder resumed (frozen {pause:?}, ttl {ttl:?}, session 10 s; granted during the pause: {during})"
        );
        assert!(
            !during,
            "round {round}: granted while the holder's session lived"
        );
        assert!(
            after < Duration::from_secs(3),
            "round {round}: granted {after:?} after the resume"
        );
        guard.release().await.unwrap();
        assert!(
            !holder.exit_success(Duration::from_secs(20)).await,
            "the resumed holder's release must fail: its lease was lost"
        );
    }
}
