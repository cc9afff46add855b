//! The file backend against real processes: a holder killed with SIGKILL
//! (the kernel frees its lock at once), holders in several processes that
//! never overlap, `flock(1)` and dlock excluding each other both ways, a
//! lock file removed or replaced under its holder, and acquisitions
//! cancelled at every point leaving nothing held, no file open and no
//! thread behind.
#![cfg(target_os = "linux")]

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError};
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::file::FileFixture;
use dlock_tests::holder::{check_marks, Holder, HolderSpec};
use tokio::io::{AsyncBufReadExt, BufReader};

const HOLDER: &str = env!("CARGO_BIN_EXE_lock-holder");

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// `flock(1)` from util-linux, or a failure that says how to install it.
fn flock_command() -> tokio::process::Command {
    let found = std::process::Command::new("flock")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "the `flock` command (util-linux) is missing: install it with `apt-get install util-linux`"
    );
    let mut command = tokio::process::Command::new("flock");
    command.kill_on_drop(true);
    command
}

/// A holder killed with SIGKILL mid-section: the kernel closes its files,
/// the waiter is woken by that close and served at once, with a greater
/// fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_its_lock_at_once() {
    let fixture = FileFixture::start();
    let key = "faults:killed";
    let spec = HolderSpec::once(
        &fixture.url,
        key,
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let mut holder = Holder::spawn(HOLDER, &spec);
    let fence: u64 = holder
        .acquired(Duration::from_secs(20))
        .await
        .parse()
        .unwrap();
    let waiter = lock(&fixture.backend().await, key).wait(Duration::from_secs(10));
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    let killed = Instant::now();
    holder.kill9().await;
    let (served, guard) = waiting.await.unwrap().expect("the waiter was never served");
    let after = served.saturating_duration_since(killed);
    assert!(
        after < Duration::from_secs(1),
        "served {after:?} after the kill"
    );
    assert!(guard.fencing_token().unwrap() > fence);
    guard.release().await.unwrap();
}

/// Four processes × 20 sections on one key: the marks never interleave and
/// the fences strictly increase across processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_in_several_processes_never_overlap() {
    let fixture = FileFixture::start();
    let marks = fixture.dir().join("marks.txt");
    let spec = HolderSpec {
        url: fixture.url.clone(),
        key: "faults:processes".into(),
        ttl: Duration::from_secs(10),
        hold: Duration::from_millis(2),
        cycles: 20,
        marks: Some(marks.clone()),
    };
    let mut holders: Vec<Holder> = (0..4).map(|_| Holder::spawn(HOLDER, &spec)).collect();
    for holder in &mut holders {
        holder.finish(Duration::from_secs(60)).await;
    }
    let text = std::fs::read_to_string(&marks).unwrap();
    assert_eq!(check_marks(&text), 80);
}

/// `flock(1)` holds the file: dlock's try finds it busy, and a waiting
/// acquire is served when the command exits (woken by its close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_command_excludes_dlock() {
    let fixture = FileFixture::start();
    let key = "interop:flock-first";
    let backend = fixture.backend().await;
    let path = fixture.file_backend().await.lock_path(key);
    let mut command = flock_command()
        .arg(&path)
        .args(["sh", "-c", "echo locked; sleep 0.5"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start flock");
    let mut lines = BufReader::new(command.stdout.take().unwrap()).lines();
    assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("locked"));
    let started = Instant::now();
    assert!(
        lock(&backend, key).try_acquire().await.unwrap().is_none(),
        "dlock took a lock flock(1) holds"
    );
    let info = lock(&backend, key)
        .inspect()
        .await
        .unwrap()
        .expect("held by flock(1)");
    assert_eq!(
        (info.holder, info.fencing_token),
        (None, None),
        "flock(1) wrote no record"
    );
    let guard = lock(&backend, key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(command.wait().await.unwrap().success());
    assert!(
        waited >= Duration::from_millis(400),
        "served after {waited:?}, while flock(1) held the lock"
    );
    assert!(
        waited < Duration::from_millis(1_400),
        "served {waited:?} after flock(1) started: not woken by its exit"
    );
    guard.release().await.unwrap();
}

/// dlock holds the file: `flock -n` fails, and a waiting `flock` runs its
/// command only after dlock's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_excludes_the_flock_command() {
    let fixture = FileFixture::start();
    let key = "interop:dlock-first";
    let backend = fixture.backend().await;
    let path = fixture.file_backend().await.lock_path(key);
    let guard = lock(&backend, key).acquire().await.unwrap();
    let status = flock_command()
        .arg("-n")
        .arg(&path)
        .arg("true")
        .status()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "flock -n took a lock dlock holds");
    let mut waiting = flock_command()
        .args(["-w", "10"])
        .arg(&path)
        .args(["sh", "-c", "echo got"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start flock");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "flock ran its command while dlock held the lock"
    );
    guard.release().await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), waiting.wait_with_output())
        .await
        .expect("flock was not served after the release")
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got\n");
}

/// A lock file removed (`rm`) or replaced (`mv` over it) under its holder:
/// the holder's lease is lost at its next renewal, and a new holder takes
/// the new file at once with a greater fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_or_replaced_lock_file_is_a_lost_lease() {
    let fixture = FileFixture::start();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    for (i, replace) in [false, true].into_iter().enumerate() {
        let key = format!("faults:replaced:{i}");
        let path = fixture.file_backend().await.lock_path(&key);
        let ttl = Duration::from_millis(600);
        let held = lock(&a, &key).ttl(ttl).acquire().await.unwrap();
        let lost = held.lost();
        if replace {
            let other = fixture.dir().join("other");
            std::fs::write(&other, b"").unwrap();
            std::fs::rename(&other, &path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
        let next = lock(&b, &key)
            .try_acquire()
            .await
            .unwrap()
            .expect("the new file is free");
        assert!(next.fencing_token() > held.fencing_token());
        tokio::time::timeout(ttl + Duration::from_secs(1), lost)
            .await
            .expect("lost() did not fire after the lock file was replaced");
        let err = held.release().await.unwrap_err();
        assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
        next.release().await.unwrap();
    }
}

/// This process's open files and threads.
fn open_files_and_threads() -> (usize, usize) {
    let files = std::fs::read_dir("/proc/self/fd").unwrap().count();
    let threads = std::fs::read_dir("/proc/self/task").unwrap().count();
    (files, threads)
}

/// Acquisitions dropped at every point of their wait, while the holder
/// lets go at every point too: none leaves the key held, a file open or a
/// thread behind, and a grant that raced its drop is never a lock nobody
/// holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_cancelled_at_every_point_leave_nothing() {
    let fixture = FileFixture::start();
    let key = "faults:cancel";
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    // Warm up: the watcher thread and the runtime's threads exist.
    let held = lock(&a, key).acquire().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(20), lock(&b, key).acquire()).await;
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = open_files_and_threads();
    for round in 0..60u64 {
        let held = lock(&a, key).acquire().await.unwrap();
        let release_after = Duration::from_micros(round * 331 % 4_000);
        let cancel_after = Duration::from_micros(round * 577 % 4_000);
        let releasing = tokio::spawn(async move {
            tokio::time::sleep(release_after).await;
            held.release().await.unwrap();
        });
        if let Ok(got) = tokio::time::timeout(cancel_after, lock(&b, key).acquire()).await {
            got.unwrap().release().await.unwrap();
        }
        releasing.await.unwrap();
        let free = lock(&c, key).try_acquire().await.unwrap();
        free.expect("a cancelled acquisition left the key held")
            .release()
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = open_files_and_threads();
    assert!(after.0 <= before.0, "open files {before:?} → {after:?}");
    assert!(after.1 <= before.1 + 2, "threads {before:?} → {after:?}");
}

/// A read-write lock's file: `flock -s` shares it with dlock's readers and
/// is kept out by its writer; `flock` (exclusive) is kept out by a reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_command_reads_and_writes_the_read_write_lock() {
    let fixture = FileFixture::start();
    let key = "interop:rw";
    let backend = fixture.backend().await;
    let path = fixture.file_backend().await.rw_lock_path(key);
    let rw = dlock::RwLock::new(key).with_backend(backend.clone());
    let flock_n = |shared: bool| {
        let mut command = flock_command();
        command.arg("-n");
        if shared {
            command.arg("-s");
        }
        command.arg(&path).arg("true");
        command
    };
    let read = rw.read().await.unwrap();
    assert_eq!(
        flock_n(true).status().await.unwrap().code(),
        Some(0),
        "flock -s kept out by a reader"
    );
    assert_eq!(
        flock_n(false).status().await.unwrap().code(),
        Some(1),
        "flock took a lock a reader holds"
    );
    read.release().await.unwrap();
    let write = rw.write().await.unwrap();
    assert_eq!(
        flock_n(true).status().await.unwrap().code(),
        Some(1),
        "flock -s took a lock the writer holds"
    );
    write.release().await.unwrap();
    assert_eq!(flock_n(false).status().await.unwrap().code(), Some(0));
}
