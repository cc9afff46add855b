//! A PostgreSQL barrier member whose process is killed (SIGKILL, so it
//! neither renews nor leaves) is counted out when its row's expiry passes
//! on the server (its ttl): the surviving member's `leave` goes on, and the
//! barrier's rows are gone afterwards (`dlock_barriers`, read with psql).

use std::process::Stdio;
use std::time::{Duration, Instant};

use dlock::Barrier;
use dlock_tests::servers::postgres::PgServer;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const ENTRANT: &str = env!("CARGO_BIN_EXE_barrier-entrant");

/// The rows of the barrier `name` (members and `ready`), as psql shows them.
fn barrier_rows(server: &PgServer, name: &str) -> usize {
    let sql = format!("SELECT count(*) FROM public.dlock_barriers WHERE name = 'dlock:{name}'");
    server.psql(&sql).trim().parse().expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_process_is_counted_out_within_its_ttl() {
    let server = PgServer::start();
    let url = server.url();
    let name = "killed-process";
    let ttl = Duration::from_secs(2);
    let mut child = Command::new(ENTRANT)
        .args([&url, name, "2", &ttl.as_millis().to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn barrier-entrant");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let backend = dlock::connect(&url).await.unwrap();
    let barrier = Barrier::new(name, 2)
        .with_backend(backend)
        .wait(Duration::from_secs(60));
    let (survivor, line) = tokio::join!(barrier.enter(), async {
        tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await
    });
    let survivor = survivor.expect("the barrier opens with both members");
    let line = line.expect("the child enters in time").unwrap();
    assert_eq!(line.as_deref(), Some("ENTERED"));
    // Two members and `ready`.
    let rows = tokio::task::block_in_place(|| barrier_rows(&server, name));
    assert_eq!(rows, 3, "two members and ready");
    child.kill().await.expect("kill the member's process");
    let killed = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), survivor.leave())
        .await
        .expect("leave ends once the dead member is counted out")
        .expect("leave");
    let took = killed.elapsed();
    eprintln!(
        "postgres barrier: a killed member's process was counted out after {took:?} (ttl {ttl:?})"
    );
    assert!(took <= ttl * 3 + Duration::from_secs(5), "took {took:?}");
    let rows = tokio::task::block_in_place(|| barrier_rows(&server, name));
    assert_eq!(rows, 0, "nothing of the barrier stays");
}
