//! dlock's `Election` and `etcdctl elect` (etcd's own Go
//! `concurrency.Election`) in one election, both ways: each waits while the
//! other leads, is elected once the other resigns, and sees the other's
//! value; `etcdctl elect -l` follows dlock's leader and its `proclaim`.
//!
//! Also the liveness of leader processes paused past their ttl and
//! resumed, or killed (`election_process_suite!`).

use dlock_tests::fixtures::etcd::EtcdFixture;
use std::sync::Arc;
use std::time::Duration;

use dlock::backends::etcd::EtcdBackend;
use dlock::{Election, Leader, LockBackend};
use dlock_tests::election::elected_after_another_leader_resigns;
use dlock_tests::servers::etcd::{EtcdServer, ETCD_PACKAGES};
use dlock_tests::servers::process::require_binary;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// A running `etcdctl elect …` and the lines it printed.
struct Etcdctl {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Etcdctl {
    fn spawn(server: &EtcdServer, args: &[&str]) -> Self {
        let path = require_binary("etcdctl", ETCD_PACKAGES).expect("etcdctl");
        let mut child = Command::new(path)
            .arg(format!("--endpoints={}", server.endpoint()))
            .args(args)
            .env("ETCDCTL_API", "3")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn etcdctl");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Etcdctl { child, lines }
    }

    /// Waits (bounded) for a printed line equal to `line`.
    async fn prints(&mut self, line: &str, within: Duration) -> bool {
        tokio::time::timeout(within, async {
            while let Some(printed) = self.lines.recv().await {
                if printed == line {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false)
    }

    /// Interrupts it, as Ctrl-C does: `etcdctl elect` resigns and exits.
    async fn interrupt(mut self) {
        let pid = self.child.id().expect("running") as i32;
        kill(Pid::from_raw(pid), Signal::SIGINT).expect("SIGINT");
        let exited = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        assert!(exited.is_ok(), "etcdctl did not exit within 10 s of SIGINT");
    }
}

async fn election(server: &EtcdServer) -> Election {
    let backend: Arc<dyn LockBackend> =
        Arc::new(EtcdBackend::connect(&server.url()).await.expect("connect"));
    Election::new("scheduler")
        .with_backend(backend)
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_waits_for_dlocks_leader_and_follows_it() {
    let server = EtcdServer::start();
    let election = election(&server).await;
    let leadership = election.campaign("node-a").await.unwrap();

    // The layout of `concurrency.Election`: one key per candidate, named
    // by its lease, the value the candidate's.
    let keys = server.etcdctl(&["get", "--prefix", "dlock-election/scheduler/"]);
    let mut lines = keys.lines();
    let key = lines.next().unwrap_or_default().to_owned();
    assert!(key.starts_with("dlock-election/scheduler/"), "{keys}");
    assert_eq!(lines.next(), Some("node-a"), "{keys}");

    let mut observer = Etcdctl::spawn(&server, &["elect", "-l", "dlock-election/scheduler"]);
    assert!(
        observer.prints("node-a", Duration::from_secs(10)).await,
        "`etcdctl elect -l` did not show dlock's leader"
    );
    let mut candidate = Etcdctl::spawn(&server, &["elect", "dlock-election/scheduler", "node-b"]);
    assert!(
        !candidate.prints("node-b", Duration::from_secs(1)).await,
        "etcdctl was elected while dlock leads"
    );
    leadership.proclaim("node-a:9090").await.unwrap();
    assert!(
        observer
            .prints("node-a:9090", Duration::from_secs(10))
            .await,
        "`etcdctl elect -l` did not follow dlock's proclaim"
    );

    let first_term = leadership.term();
    leadership.resign().await.unwrap();
    assert!(
        candidate.prints("node-b", Duration::from_secs(5)).await,
        "etcdctl was not elected within 5 s of dlock's resignation"
    );
    let leader = election.leader().await.unwrap().expect("etcdctl leads");
    assert_eq!(leader.value, "node-b");
    assert!(leader.term > first_term);
    assert!(observer.prints("node-b", Duration::from_secs(10)).await);

    // And back: dlock waits for etcdctl, and is elected once it resigns.
    let again =
        elected_after_another_leader_resigns(&election, "node-a", "etcdctl", candidate.interrupt())
            .await;
    assert!(again.term() > leader.term);
    assert!(observer.prints("node-a", Duration::from_secs(10)).await);
    again.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_waits_for_etcdctls_leader_and_reads_it() {
    let server = EtcdServer::start();
    let election = election(&server).await;
    let mut changes = election.observe();
    use futures_util::StreamExt;
    assert_eq!(changes.next().await, Some(None));

    let mut candidate = Etcdctl::spawn(&server, &["elect", "dlock-election/scheduler", "node-b"]);
    assert!(
        candidate.prints("node-b", Duration::from_secs(10)).await,
        "etcdctl was not elected in an empty election"
    );
    let seen = tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("dlock's observer saw etcdctl's election")
        .flatten()
        .expect("a leader");
    assert_eq!(seen.value, "node-b");
    assert_eq!(election.leader().await.unwrap(), Some(seen.clone()));

    let leadership =
        elected_after_another_leader_resigns(&election, "node-a", "etcdctl", candidate.interrupt())
            .await;
    assert!(leadership.term() > seen.term);
    let mut last = seen;
    // The observer sees the resignation (or not, if both fell between two
    // reads) and then dlock's leader, never going back.
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("a change within 10 s")
            .expect("the stream goes on");
        match next {
            None => continue,
            Some(leader) => {
                assert!(leader.term > last.term);
                last = leader;
                if last
                    == (Leader {
                        value: "node-a".into(),
                        term: leadership.term(),
                    })
                {
                    break;
                }
            }
        }
    }
    leadership.resign().await.unwrap();
}

dlock_tests::election_process_suite!(
    EtcdFixture::single(),
    env!("CARGO_BIN_EXE_election-candidate")
);
