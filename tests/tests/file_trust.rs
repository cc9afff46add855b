//! Another user in the lock directory: a lock file, fence counter or
//! temporary name made ready by them, a fence counter set to a value that
//! would repeat tokens or go back, a world-writable directory, a FIFO at a
//! lock's name. Each is refused with an error naming the file, its owner
//! and mode; nothing is locked, the planted files are left as they were,
//! and no call blocks (every call here is bounded by a timeout).
//!
//! "Another user" is `nobody` (files chowned to it) when the tests run as
//! root, and otherwise a file every user may write (mode 0666): both are
//! files another user controls.
#![cfg(target_os = "linux")]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dlock::backends::file::FileBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::fixtures::file::FileFixture;

/// The bound of every call: a hang fails the test instead.
const BOUND: Duration = Duration::from_secs(10);

/// Runs `call` bounded by [`BOUND`].
async fn bounded<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, call)
        .await
        .unwrap_or_else(|_| panic!("{what} did not return within {BOUND:?}"))
}

/// `nobody`'s uid and gid from `/etc/passwd` when this process is root.
fn nobody() -> Option<(u32, u32)> {
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let found = passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&"nobody") && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    });
    Some(found.expect(
        "the tests run as root and play another user as `nobody`, which /etc/passwd lacks: add it (`useradd -r nobody`)",
    ))
}

/// Writes `text` at `path` as a file of another user: chowned to `nobody`
/// with mode 0644 when root, else mode 0666. Gives what the refusal must
/// name (the owner or the mode).
fn plant(path: &Path, text: &str) -> String {
    std::fs::write(path, text).unwrap();
    match nobody() {
        Some((uid, gid)) => {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
            format!("uid {uid}")
        }
        None => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
            "0666".to_owned()
        }
    }
}

/// A file's owner, mode and text: what must stay as planted.
fn state(path: &Path) -> (u32, u32, String) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    (meta.uid(), meta.mode() & 0o7777, text)
}

async fn try_take(
    backend: &Arc<dyn LockBackend>,
    key: &str,
) -> Result<Option<dlock::LockGuard>, LockError> {
    bounded(
        "try_acquire",
        Lock::new(key).with_backend(backend.clone()).try_acquire(),
    )
    .await
}

/// A lock file another user created first (to read the record, hold the
/// lock or move it away) is refused, named with its owner and mode, and
/// left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_file_another_user_made_is_refused() {
    let fixture = FileFixture::start();
    let files = fixture.file_backend().await;
    let path = files.lock_path("planted");
    let owner = plant(&path, "");
    let before = state(&path);
    let backend: Arc<dyn LockBackend> = Arc::new(files);
    let err = try_take(&backend, "planted").await.unwrap_err().to_string();
    println!("file trust: planted lock file refused: {err}");
    assert!(
        err.contains("dlock~planted.lock") && err.contains(&owner),
        "{err}"
    );
    let err = bounded(
        "acquire",
        Lock::new("planted")
            .with_backend(backend.clone())
            .wait(Duration::from_millis(300))
            .acquire(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains(&owner), "{err}");
    let err = bounded("inspect", backend.inspect("planted"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&owner), "{err}");
    assert_eq!(state(&path), before, "the planted file was changed");
}

/// Fence counters: another user's counter is refused; one of ours that
/// does not parse, is near u64::MAX (tokens would saturate and repeat) or
/// was set below a token this process issued is an error, not a reset; the
/// key is not left locked (once the counter is right, it is granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counters_that_would_repeat_or_go_back_are_refused() {
    let fixture = FileFixture::start();
    let backend: Arc<dyn LockBackend> = Arc::new(fixture.file_backend().await);
    let fence = fixture.dir().join("dlock~fenced.fence");

    let owner = plant(&fence, "5\n");
    let before = state(&fence);
    let err = try_take(&backend, "fenced").await.unwrap_err().to_string();
    println!("file trust: another user's fence counter refused: {err}");
    assert!(
        err.contains("dlock~fenced.fence") && err.contains(&owner),
        "{err}"
    );
    assert_eq!(state(&fence), before, "the planted counter was changed");
    std::fs::remove_file(&fence).unwrap();

    let guard = try_take(&backend, "fenced").await.unwrap().expect("free");
    let issued = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    let mode = std::fs::Permissions::from_mode(0o600);
    for (text, says) in [
        ("18446744073709551614\n", "more than any clock"),
        ("not a number\n", "not a number"),
        ("0\n", "below"),
    ] {
        std::fs::write(&fence, text).unwrap();
        std::fs::set_permissions(&fence, mode.clone()).unwrap();
        let err = try_take(&backend, "fenced").await.unwrap_err().to_string();
        println!("file trust: counter {:?} refused: {err}", text.trim());
        assert!(
            err.contains(says) && err.contains("dlock~fenced.fence"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(&fence).unwrap(),
            text,
            "the counter was rewritten"
        );
    }
    std::fs::write(&fence, format!("{issued}\n")).unwrap();
    let guard = try_take(&backend, "fenced")
        .await
        .unwrap()
        .expect("nothing was left locked by the refusals");
    assert!(guard.fencing_token().unwrap() > issued, "tokens went back");
    guard.release().await.unwrap();
}

/// `force_release` once wrote `<lock>.forced-<pid>.tmp` without `O_EXCL`:
/// a user who made that name first ended up owning the new lock file. Now
/// the name is random and created exclusively: the new lock file is
/// dlock's (mode 0600), and the planted file is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_makes_its_new_lock_file_itself() {
    let fixture = FileFixture::start();
    let holder: Arc<dyn LockBackend> = Arc::new(fixture.file_backend().await);
    let operator = fixture.file_backend().await;
    let path = operator.lock_path("forced");
    let held = try_take(&holder, "forced").await.unwrap().expect("free");
    let planted = fixture.dir().join(format!(
        "dlock~forced.lock.forced-{}.tmp",
        std::process::id()
    ));
    plant(&planted, "");
    let before = state(&planted);
    assert!(bounded("force_release", operator.force_release("forced"))
        .await
        .unwrap());
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    let (uid, mode, _) = state(&path);
    println!("file trust: lock file after force_release: uid {uid}, mode {mode:04o}");
    assert_eq!(
        (uid, mode),
        (me, 0o600),
        "the new lock file is not dlock's own"
    );
    assert_eq!(state(&planted), before);
    bounded("lost", held.lost()).await;
    let leftovers: Vec<_> = std::fs::read_dir(fixture.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") && !n.contains(&format!("-{}.tmp", std::process::id())))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// A directory every user may write (mode 1777, as /tmp) is refused at
/// `connect` naming `?shared_dir=accept`; with it, connect works and a
/// lock file another user made there is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_world_writable_directory_needs_an_opt_in() {
    let fixture = FileFixture::start();
    let shared = fixture.dir().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let url = format!("file://{}", shared.display());
    let err = bounded("connect", FileBackend::connect(&url))
        .await
        .unwrap_err();
    println!("file trust: world-writable directory refused: {err}");
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("1777") && text.contains("shared_dir=accept"),
        "{text}"
    );
    let err = bounded(
        "connect",
        FileBackend::connect(&format!("{url}?shared_dir=maybe")),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("shared_dir=maybe"), "{err}");

    let files = bounded(
        "connect",
        FileBackend::connect(&format!("{url}?shared_dir=accept")),
    )
    .await
    .expect("accepted with the opt-in");
    let owner = plant(&files.lock_path("planted"), "");
    let backend: Arc<dyn LockBackend> = Arc::new(files);
    let err = try_take(&backend, "planted").await.unwrap_err().to_string();
    assert!(err.contains(&owner), "{err}");
    let guard = try_take(&backend, "mine")
        .await
        .unwrap()
        .expect("a fresh key is dlock's");
    guard.release().await.unwrap();
}

/// A FIFO at a lock's name: `inspect`, `list`, `try_acquire` and
/// `force_release` answer at once with an error naming it (they opened it
/// for reading and blocked forever before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_at_a_locks_name_is_refused_without_blocking() {
    let fixture = FileFixture::start();
    let files = fixture.file_backend().await;
    let path = files.lock_path("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("`mkfifo` (coreutils) is missing: install it with `apt-get install coreutils`");
    assert!(made.success());
    let backend: Arc<dyn LockBackend> = Arc::new(files);
    let started = std::time::Instant::now();
    let inspect = bounded("inspect", backend.inspect("fifo"))
        .await
        .unwrap_err()
        .to_string();
    let list = bounded("list", backend.list(""))
        .await
        .unwrap_err()
        .to_string();
    let take = try_take(&backend, "fifo").await.unwrap_err().to_string();
    let force = bounded("force_release", backend.force_release("fifo"))
        .await
        .unwrap_err()
        .to_string();
    println!(
        "file trust: FIFO refused by inspect, list, try_acquire, force_release in {:?}: {inspect}",
        started.elapsed()
    );
    for err in [inspect, list, take, force] {
        assert!(
            err.contains("dlock~fifo.lock") && err.contains("FIFO"),
            "{err}"
        );
    }
}
