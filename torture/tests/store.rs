//! The fenced store on its own, as its own process: a stale fence is refused at `begin`
//! and at `commit`, an overlap is detected and logged, a killed worker's interval is
//! closed as abandoned, and the log reads back as the checker reads it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use dlock_torture::store::{WriteOutcome, WriteRecord};
use dlock_torture::store_client::{Opened, StoreClient};

struct Store {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_store() -> Store {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("store.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_torture-store"))
        .arg("--log")
        .arg(&log)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start torture-store");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the address");
    let addr = line
        .trim()
        .strip_prefix("LISTENING ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("store printed `{line}`"));
    Store {
        child,
        addr,
        log,
        _dir: dir,
    }
}

fn open(opened: Opened) -> (u64, u64) {
    match opened {
        Opened::Open { id, value } => (id, value),
        Opened::Stale => panic!("expected an open interval, got Stale"),
    }
}

async fn shutdown_and_read(store: &mut Store) -> Vec<WriteRecord> {
    let mut admin = StoreClient::connect(store.addr, "admin")
        .await
        .expect("connect");
    admin.shutdown().await.expect("SHUTDOWN");
    let status = store.child.wait().expect("wait for the store");
    assert!(status.success(), "the store exited with {status}");
    std::fs::read_to_string(&store.log)
        .expect("read the log")
        .lines()
        .map(|l| WriteRecord::parse(l).expect("a record"))
        .collect()
}

#[tokio::test]
async fn a_stale_fence_is_refused_and_an_overlap_is_detected() {
    let mut store = start_store();
    let mut old = StoreClient::connect(store.addr, "w0.0")
        .await
        .expect("connect");
    let mut new = StoreClient::connect(store.addr, "w1.0")
        .await
        .expect("connect");

    // w0 holds fence 10 and begins; it "pauses"; w1 takes over with fence 11 and begins
    // while w0's interval is open: an overlap.
    let (old_id, old_value) = open(old.begin("k", Some(10), 1).await.expect("begin"));
    let (new_id, new_value) = open(new.begin("k", Some(11), 1).await.expect("begin"));
    assert_eq!((old_value, new_value), (0, 0));
    assert!(
        new.commit(new_id, new_value + 1).await.expect("commit"),
        "newer fence accepted"
    );
    // w0 wakes up and writes with its old fence: refused at commit
    assert!(
        !old.commit(old_id, old_value + 1).await.expect("commit"),
        "stale commit refused"
    );
    // and a new begin with the old fence is refused at once
    assert_eq!(
        old.begin("k", Some(10), 1).await.expect("begin"),
        Opened::Stale
    );
    // an equal-or-higher fence is fine, and reads the value the accepted write left
    let (id, value) = open(new.begin("k", Some(11), 1).await.expect("begin"));
    assert_eq!(value, 1, "the refused write did not land");
    new.abort(id).await.expect("abort");

    let records = shutdown_and_read(&mut store).await;
    let by_worker = |w: &str, o: WriteOutcome| {
        records
            .iter()
            .filter(|r| r.worker == w && r.outcome == o)
            .count()
    };
    assert_eq!(by_worker("w1.0", WriteOutcome::Accepted), 1);
    assert_eq!(by_worker("w0.0", WriteOutcome::RejectedAtCommit), 1);
    assert_eq!(by_worker("w0.0", WriteOutcome::Stale), 1);
    assert_eq!(by_worker("w1.0", WriteOutcome::Aborted), 1);
    let overlapping: Vec<&WriteRecord> =
        records.iter().filter(|r| !r.overlaps.is_empty()).collect();
    assert_eq!(overlapping.len(), 1, "one overlap: {records:#?}");
    assert_eq!(overlapping[0].worker, "w1.0");
    assert_eq!(overlapping[0].overlaps, vec![old_id]);
}

#[tokio::test]
async fn without_fences_both_writes_land_and_the_overlap_is_unsafe() {
    let mut store = start_store();
    let mut a = StoreClient::connect(store.addr, "a")
        .await
        .expect("connect");
    let mut b = StoreClient::connect(store.addr, "b")
        .await
        .expect("connect");
    let (a_id, a_value) = open(a.begin("k", None, 1).await.expect("begin"));
    let (b_id, b_value) = open(b.begin("k", None, 1).await.expect("begin"));
    assert!(a.commit(a_id, a_value + 1).await.expect("commit"));
    assert!(b.commit(b_id, b_value + 1).await.expect("commit"));
    // the same worker twice is not an overlap; a semaphore of 2 admits two
    let (s1, _) = open(a.begin("sem", None, 2).await.expect("begin"));
    let (s2, _) = open(b.begin("sem", None, 2).await.expect("begin"));
    let mut c = StoreClient::connect(store.addr, "c")
        .await
        .expect("connect");
    let (s3, _) = open(c.begin("sem", None, 2).await.expect("begin"));
    for (client, id) in [(&mut a, s1), (&mut b, s2), (&mut c, s3)] {
        client.commit(id, 1).await.expect("commit");
    }
    let records = shutdown_and_read(&mut store).await;
    let k: Vec<&WriteRecord> = records.iter().filter(|r| r.key == "k").collect();
    assert!(k.iter().all(|r| r.outcome == WriteOutcome::Accepted));
    assert_eq!(k.iter().filter(|r| !r.overlaps.is_empty()).count(), 1);
    let sem: Vec<&WriteRecord> = records.iter().filter(|r| r.key == "sem").collect();
    let excess: Vec<&&WriteRecord> = sem.iter().filter(|r| !r.overlaps.is_empty()).collect();
    assert_eq!(
        excess.len(),
        1,
        "only the third permit holder overlaps: {sem:#?}"
    );
    assert_eq!(excess[0].worker, "c");
}

#[tokio::test]
async fn a_dead_workers_open_interval_is_abandoned() {
    let mut store = start_store();
    let mut dying = StoreClient::connect(store.addr, "w3.0")
        .await
        .expect("connect");
    open(dying.begin("k", Some(5), 1).await.expect("begin"));
    drop(dying); // the connection closes, as when the worker is SIGKILLed
    let mut next = StoreClient::connect(store.addr, "w3.1")
        .await
        .expect("connect");
    // wait (bounded) until the store has seen the close: then the next begin overlaps nothing
    let mut overlapped = true;
    for _ in 0..100 {
        let (id, _) = open(next.begin("k", Some(6), 1).await.expect("begin"));
        next.commit(id, 1).await.expect("commit");
        let log = std::fs::read_to_string(&store.log).unwrap_or_default();
        if log.contains("abandoned") {
            overlapped = false;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!overlapped, "the dead worker's interval was never closed");
    let records = shutdown_and_read(&mut store).await;
    assert_eq!(
        records
            .iter()
            .filter(|r| r.outcome == WriteOutcome::Abandoned && r.worker == "w3.0")
            .count(),
        1
    );
}

#[tokio::test]
async fn bad_requests_get_an_error_line_not_a_crash() {
    let store = start_store();
    let stream = tokio::net::TcpStream::connect(store.addr)
        .await
        .expect("connect");
    let (read, mut write) = stream.into_split();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(read));
    for (request, answer) in [
        ("BEGIN k 1 1", "ERR say `HELLO"),
        ("HELLO w", "OK"),
        ("BEGIN k notanumber 1", "ERR bad fence"),
        ("COMMIT 999 1", "ERR no open write interval 999"),
        ("FROB", "ERR unknown request"),
    ] {
        tokio::io::AsyncWriteExt::write_all(&mut write, format!("{request}\n").as_bytes())
            .await
            .expect("write");
        let line = lines.next_line().await.expect("read").expect("a line");
        assert!(line.starts_with(answer), "{request} -> {line}");
    }
}
