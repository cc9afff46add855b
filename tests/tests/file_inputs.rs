//! The file backend's inputs: keys and links that try to reach outside the
//! directory, directories it must refuse (relative, missing, a file), the
//! mode of the files it creates, and fences that never go back when the
//! counter file is lost.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use dlock::backends::file::FileBackend;
use dlock::{Lock, LockBackend, LockError};
use dlock_tests::acquisitions::acquire_and_release;
use dlock_tests::conformance::Fixture;
use dlock_tests::fixtures::file::FileFixture;

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// Every file in `dir`, by name.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Keys spelled like paths out of the directory stay files directly in
/// it (no subdirectory, nothing beside it), each listed and inspected
/// under its own key, a long one by the key kept in its record.
#[tokio::test]
async fn keys_never_leave_the_directory() {
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("locks");
    std::fs::create_dir(&dir).unwrap();
    let url = format!("file://{}", dir.display());
    let backend: Arc<dyn LockBackend> = Arc::new(FileBackend::connect(&url).await.unwrap());
    let long = format!("deep/{}", "../".repeat(150));
    let keys = [
        "../escape",
        "/etc/passwd-dlock",
        "a/../../b",
        "..",
        ".",
        "~x",
        "#y",
        long.as_str(),
    ];
    let mut guards = Vec::new();
    for key in keys {
        guards.push(lock(&backend, key).acquire().await.unwrap());
    }
    assert_eq!(
        names(outer.path()),
        ["locks"],
        "a file outside the directory"
    );
    for name in names(&dir) {
        let path = dir.join(&name);
        assert!(
            path.is_file() && !path.is_symlink(),
            "{name} is not a plain file"
        );
        assert!(name.len() <= 255, "{name}");
    }
    let listed = dlock::list_locks(&*backend, "").await.unwrap();
    let mut listed_keys: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
    let mut expected = keys.to_vec();
    listed_keys.sort_unstable();
    expected.sort_unstable();
    assert_eq!(listed_keys, expected);
    for (key, guard) in keys.iter().zip(&guards) {
        let info = lock(&backend, key).inspect().await.unwrap().expect("held");
        assert_eq!(info.fencing_token, guard.fencing_token(), "{key}");
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert!(dlock::list_locks(&*backend, "").await.unwrap().is_empty());
}

/// A symbolic link at a lock file's name (planted to make dlock write
/// elsewhere) is refused by name; its target is untouched.
#[tokio::test]
async fn a_link_at_the_lock_name_is_refused() {
    let fixture = FileFixture::start();
    let backend = fixture.backend().await;
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), b"precious").unwrap();
    let path = fixture.file_backend().await.lock_path("linked");
    std::os::unix::fs::symlink(outside.path(), &path).unwrap();
    let err = lock(&backend, "linked").acquire().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    let shown = format!("{err:#}");
    assert!(
        format!("{text} {shown} {:?}", std::error::Error::source(&err)).contains("symbolic link"),
        "{err:?}"
    );
    assert_eq!(std::fs::read(outside.path()).unwrap(), b"precious");
}

/// Directories it cannot use are refused at `connect`, naming the path and
/// what to do.
#[tokio::test]
async fn bad_directories_are_refused_clearly() {
    let fixture = FileFixture::start();
    let file = fixture.dir().join("plain-file");
    std::fs::write(&file, b"").unwrap();
    let missing = fixture.dir().join("missing");
    for (url, says) in [
        ("file://relative/dir".to_owned(), "three slashes"),
        (
            format!("file://{}", missing.display()),
            "does not exist; create it",
        ),
        (format!("file://{}", file.display()), "is not a directory"),
        (format!("{}?prefx=a", fixture.url), "did you mean `prefix`?"),
        (format!("{}?mode=0400", fixture.url), "read and write"),
    ] {
        let err = dlock::connect(&url).await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidOption { .. }),
            "{url}: {err:?}"
        );
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}

/// Files are created `0600` by default and with `?mode=` exactly,
/// whatever the umask.
#[tokio::test]
async fn files_get_the_configured_mode() {
    let fixture = FileFixture::start();
    for (url, mode, key) in [
        (fixture.url.clone(), 0o600, "mode:default"),
        (format!("{}?mode=0660", fixture.url), 0o660, "mode:group"),
    ] {
        let backend: Arc<dyn LockBackend> = Arc::new(FileBackend::connect(&url).await.unwrap());
        acquire_and_release(&lock(&backend, key)).await;
        let stem = fixture
            .file_backend()
            .await
            .lock_path(key)
            .display()
            .to_string();
        let stem = stem.strip_suffix(".lock").unwrap();
        for path in [format!("{stem}.lock"), format!("{stem}.fence")] {
            let found = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(found, mode, "{path}: {found:o}");
        }
    }
}

/// A lost fence counter: the next fence is still greater (the clock
/// floor), and the counter file is written anew. A garbled one is an
/// error naming it (dlock does not guess a counter), nothing held; once
/// the operator removes it, the clock floor goes on above every token.
#[tokio::test]
async fn fences_never_go_back_when_the_counter_is_lost() {
    let fixture = FileFixture::start();
    let backend = fixture.backend().await;
    let key = "fence:lost";
    let path = fixture
        .file_backend()
        .await
        .lock_path(key)
        .display()
        .to_string();
    let counter = format!("{}.fence", path.strip_suffix(".lock").unwrap());
    let mut last = 0;
    for damage in ["none", "remove", "garble", "none"] {
        match damage {
            "remove" => std::fs::remove_file(&counter).unwrap(),
            "garble" => {
                std::fs::write(&counter, b"not a number").unwrap();
                let err = lock(&backend, key).try_acquire().await.unwrap_err();
                assert!(err.to_string().contains("not a number"), "{err}");
                std::fs::remove_file(&counter).unwrap();
            }
            _ => {}
        }
        let guard = lock(&backend, key).acquire().await.unwrap();
        let fence = guard.fencing_token().unwrap();
        assert!(fence > last, "{damage}: {fence} after {last}");
        assert_eq!(
            std::fs::read_to_string(&counter).unwrap().trim(),
            fence.to_string()
        );
        last = fence;
        guard.release().await.unwrap();
    }
    // No temporary file stays behind.
    assert!(
        !names(fixture.dir()).iter().any(|n| n.ends_with(".tmp")),
        "{:?}",
        names(fixture.dir())
    );
}

/// The lock file is what `inspect` reads and what a person sees: the
/// record while held, empty after the release.
#[tokio::test]
async fn the_record_is_written_while_held_and_cleared_on_release() {
    let fixture = FileFixture::start();
    let backend: Arc<dyn LockBackend> = Arc::new(
        FileBackend::connect(&format!("{}?client_name=cron-7", fixture.url))
            .await
            .unwrap(),
    );
    let path = fixture.file_backend().await.lock_path("record");
    let guard = lock(&backend, "record").acquire().await.unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("key=record\n") && text.contains("holder=cron-7\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!("pid={}\n", std::process::id())),
        "{text}"
    );
    assert!(
        !text.contains(guard.token()),
        "the owner token is not written: {text}"
    );
    guard.release().await.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
}
