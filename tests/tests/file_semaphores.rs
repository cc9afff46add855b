//! The file backend's semaphores against real processes and the kernel: a
//! permit holder killed with SIGKILL (the kernel frees its slot file, and
//! the waiter is woken by that close), permit acquisitions cancelled at
//! every point leaving no slot held and no file open, the files a
//! semaphore makes (their names and modes, nothing outside the directory),
//! and the line of waiters' ticket files (gone with a dropped wait; a dead
//! waiter's skipped and removed).
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockBackend, LockError, Semaphore};
use dlock_tests::acquisitions::acquire_and_release_permit;
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::file::FileFixture;
use dlock_tests::holder::Holder;

const HOLDER: &str = env!("CARGO_BIN_EXE_permit-holder");

fn semaphore(backend: &Arc<dyn LockBackend>, name: &str, permits: usize) -> Semaphore {
    Semaphore::new(name, permits).with_backend(backend.clone())
}

/// Both permits of the semaphore `name` (of 2) are held: a try is refused
/// (`why` in the message when it is not).
async fn assert_no_permit_free(backend: &Arc<dyn LockBackend>, name: &str, why: &str) {
    let permit = semaphore(backend, name, 2).try_acquire().await.unwrap();
    assert!(permit.is_none(), "{why}");
}

/// A permit holder killed with SIGKILL, with a 30 s ttl: the kernel frees
/// its slot when it closes the process's files, and a waiter of another
/// client is served within a second (not after the ttl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_permit_holder_frees_its_slot_at_once() {
    let fixture = FileFixture::start();
    let name = "faults:permits";
    let mut holders: Vec<Holder> = (0..2)
        .map(|_| {
            Holder::spawn_permit(
                HOLDER,
                &fixture.url,
                name,
                2,
                Duration::from_secs(30),
                Duration::from_secs(60),
            )
        })
        .collect();
    for holder in &mut holders {
        holder.acquired(Duration::from_secs(20)).await;
    }
    let backend = fixture.backend().await;
    assert_no_permit_free(&backend, name, "both permits are held by the two processes").await;
    let waiter = semaphore(&backend, name, 2).wait(Duration::from_secs(10));
    let waiting = tokio::spawn(async move {
        let permit = waiter.acquire().await?;
        Ok::<_, LockError>((Instant::now(), permit))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter got a permit while both were held"
    );
    let killed = Instant::now();
    holders[0].kill9().await;
    let (served, permit) = waiting.await.unwrap().expect("the waiter was never served");
    let after = served.saturating_duration_since(killed);
    println!("served {after:?} after the SIGKILL");
    assert!(
        after < Duration::from_secs(1),
        "served {after:?} after the kill"
    );
    assert_no_permit_free(
        &backend,
        name,
        "the waiter and the live process hold both permits",
    )
    .await;
    permit.release().await.unwrap();
    holders[1].kill9().await;
}

/// This process's open files.
fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Permit acquisitions dropped at every point of their wait, while the
/// holder lets go at every point too: afterwards every permit can be taken
/// by another client (no slot held, no count file kept shared), and no
/// file stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_acquisitions_cancelled_at_every_point_leave_nothing() {
    const PERMITS: usize = 2;
    let fixture = FileFixture::start();
    let name = "faults:cancel-permits";
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    // Warm up: the watcher thread and the runtime's threads exist.
    let one = semaphore(&a, name, PERMITS).acquire().await.unwrap();
    let two = semaphore(&a, name, PERMITS).acquire().await.unwrap();
    let _ = tokio::time::timeout(
        Duration::from_millis(20),
        semaphore(&b, name, PERMITS).acquire(),
    )
    .await;
    one.release().await.unwrap();
    two.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = open_files();
    for round in 0..60u64 {
        let kept = semaphore(&a, name, PERMITS).acquire().await.unwrap();
        let held = semaphore(&a, name, PERMITS).acquire().await.unwrap();
        let release_after = Duration::from_micros(round * 331 % 4_000);
        let cancel_after = Duration::from_micros(round * 577 % 4_000);
        let releasing = tokio::spawn(async move {
            tokio::time::sleep(release_after).await;
            held.release().await.unwrap();
        });
        let waiter = semaphore(&b, name, PERMITS);
        if let Ok(got) = tokio::time::timeout(cancel_after, waiter.acquire()).await {
            got.unwrap().release().await.unwrap();
        }
        releasing.await.unwrap();
        kept.release().await.unwrap();
        let mut free = Vec::new();
        for _ in 0..PERMITS {
            let permit = semaphore(&c, name, PERMITS).try_acquire().await.unwrap();
            free.push(permit.expect("a cancelled acquisition left a slot held"));
        }
        // No count file kept shared either: another count is served.
        for permit in free {
            permit.release().await.unwrap();
        }
        let recount = semaphore(&c, name, PERMITS + 1).try_acquire().await;
        recount
            .expect("a cancelled acquisition kept the count")
            .expect("every permit is back: another count is served")
            .release()
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = open_files();
    assert!(after <= before, "open files {before} → {after}");
}

/// A semaphore's files: `<prefix>~sem~<escaped name>~count` and one
/// `~<slot>.lock` per permit, inside the directory whatever the name, with
/// mode 0600; the count file holds the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_files_stay_in_the_directory_with_mode_0600() {
    let fixture = FileFixture::start();
    let backend = fixture.backend().await;
    let name = "../../etc/x";
    let permit = semaphore(&backend, name, 3).acquire().await.unwrap();
    let mut files: Vec<String> = std::fs::read_dir(fixture.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "dlock~sem~..%2F..%2Fetc%2Fx~0.lock",
            "dlock~sem~..%2F..%2Fetc%2Fx~count"
        ],
        "the first slot and the count"
    );
    for file in &files {
        let mode = std::fs::metadata(fixture.dir().join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
    let count =
        std::fs::read_to_string(fixture.dir().join("dlock~sem~..%2F..%2Fetc%2Fx~count")).unwrap();
    assert_eq!(count, "3\n");
    permit.release().await.unwrap();
    let long = "n".repeat(400);
    let permit = semaphore(&backend, &long, 1).acquire().await.unwrap();
    let hashed = std::fs::read_dir(fixture.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.starts_with("dlock~sem~#"))
        .count();
    assert_eq!(hashed, 2, "a long name is hashed: its slot and count");
    permit.release().await.unwrap();
    let err = semaphore(&backend, "many", 5_000)
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("at most 1024"), "{err}");
}

/// `flock(1)` on a slot file takes that permit: dlock's callers use the
/// other slots, and are kept out once every slot is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_command_on_a_slot_takes_that_permit() {
    let fixture = FileFixture::start();
    let backend = fixture.backend().await;
    let name = "shell-permits";
    // Creates the files.
    acquire_and_release_permit(&semaphore(&backend, name, 2)).await;
    let slot = fixture.dir().join("dlock~sem~shell-permits~0.lock");
    let mut shell = tokio::process::Command::new("flock")
        .arg(&slot)
        .args(["sleep", "60"])
        .stdout(std::process::Stdio::null())
        // A group of its own: killing the group ends `flock` and `sleep`,
        // which shares the locked open file.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("the `flock` command (util-linux): install it with `apt-get install util-linux`");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mine = semaphore(&backend, name, 2).try_acquire().await.unwrap();
    let mine = mine.expect("slot 1 is free");
    assert_no_permit_free(&backend, name, "flock(1) holds slot 0, dlock slot 1").await;
    let waiter = semaphore(&backend, name, 2).wait(Duration::from_secs(10));
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Instant::now();
    let group = format!("-{}", shell.id().unwrap());
    let killed_group = std::process::Command::new("kill")
        .args(["-KILL", "--", &group])
        .status()
        .unwrap();
    assert!(killed_group.success());
    shell.wait().await.unwrap();
    let permit = waiting.await.unwrap().expect("served once flock(1) exits");
    assert!(killed.elapsed() < Duration::from_secs(1));
    permit.release().await.unwrap();
    mine.release().await.unwrap();
}

/// The line of waiters (`acquire_many`'s arrival order): a waiter's ticket
/// `<prefix>~sem~<name>~turn~<20 digits>` is there, mode 0600, while it
/// waits, and gone when its wait is dropped; a ticket nobody keeps locked
/// (what a killed waiter leaves: the kernel dropped its lock) does not stop
/// a taker, and is removed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_of_waiters_keeps_no_dead_ticket() {
    let fixture = FileFixture::start();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let tickets = || -> Vec<String> {
        std::fs::read_dir(fixture.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.starts_with("dlock~sem~line~turn"))
            .collect()
    };
    let one = semaphore(&a, "line", 2).acquire().await.unwrap();
    let waiting = semaphore(&b, "line", 2).wait(Duration::from_secs(30));
    let waiter = tokio::spawn(async move { waiting.acquire_many(2).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while tickets().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let standing = tickets();
    assert_eq!(standing.len(), 1, "{standing:?}");
    assert!(
        standing[0].len() == "dlock~sem~line~turn~".len() + 20,
        "{standing:?}"
    );
    let mode = std::fs::metadata(fixture.dir().join(&standing[0]))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        semaphore(&a, "line", 2)
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a try_acquire overtook the waiter of 2"
    );
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(
        tickets(),
        Vec::<String>::new(),
        "a dropped wait left its ticket"
    );
    // A killed waiter's ticket: at its name, locked by nobody.
    std::fs::write(
        fixture
            .dir()
            .join("dlock~sem~line~turn~00000000000000000007"),
        "",
    )
    .unwrap();
    let other = semaphore(&b, "line", 2)
        .try_acquire()
        .await
        .unwrap()
        .expect("a dead waiter's ticket stopped a taker");
    assert_eq!(tickets(), Vec::<String>::new(), "the dead ticket stayed");
    other.release().await.unwrap();
    one.release().await.unwrap();
}
