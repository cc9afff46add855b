//! Files of a local directory (`file:///path/to/dir`): locks for the
//! processes of one host, with no server. A lock on key K is an exclusive
//! `flock(2)` on the file `<dir>/<prefix>~<K>.lock`, so the kernel is the
//! lock service: it frees the lock the instant the holding process exits
//! or is killed, and `flock(1)` on the same file takes part (each excludes
//! the other, both ways).
//!
//! Linux only (it waits with inotify and reads `/proc/locks`).
//!
//! # URL
//!
//! `file:///absolute/path/to/dir[?prefix=…&client_name=…&mode=0600&shared_dir=accept]`:
//! three slashes, then the directory's absolute path (`file://localhost/…`
//! is the same; `%20` for a space). The directory must exist and be
//! writable; a relative path, a missing directory, a file, or a directory
//! on a network file system is an [`InvalidOption`](crate::LockError::InvalidOption)
//! error naming it and what to do. Parameters:
//!
//! - `prefix` (default `dlock`): the first part of every file name, so
//!   several applications can share a directory.
//! - `client_name`: the name written beside each lease (see
//!   `crate::inspect`); by default `hostname:pid`.
//! - `mode` (default `0600`): the permission bits of the files dlock
//!   creates, set exactly (not narrowed by the umask). `0660` (with a
//!   directory of the group) lets the processes of several users share
//!   locks; each must be able to open the files for reading and writing.
//! - `shared_dir=accept`: use a directory every user may write (mode
//!   `o+w`, such as `/tmp`), which `connect` otherwise refuses: any user
//!   could create a key's files first there. The per-file checks still
//!   apply (see *Trust* below).
//!
//! # Trust
//!
//! A lock file, fence counter or leader record is used only if it is a
//! regular file owned by dlock's user or root (or, with `?mode=` giving the
//! group read and write, by the directory's group) and writable by no one
//! beyond what `?mode=` grants; otherwise the call fails naming the file,
//! its owner and mode. Every open is `O_NONBLOCK | O_NOFOLLOW` (a FIFO does
//! not block). A fence counter that is not a number, at or above 2^63, or
//! below a token this backend issued is an error, not a reset. Temporary
//! files get random names, created with `O_EXCL`. See the `trust` module.
//!
//! # Files
//!
//! For a key K, with `prefix` P (K's bytes other than ASCII letters,
//! digits, `-`, `_`, `.` and `:` written `%XX`, so a key never names a
//! path: `a/../b` is `P~a%2F..%2Fb`; a name over 200 bytes is `P~#` and 32
//! hex digits of the key's SHA-256):
//!
//! - `P~K.lock`: the lock. Its holder writes a small text record into it
//!   (key, client name, pid, fencing token, expiry by the wall clock) for
//!   `inspect` and `list`, and empties it when it lets go. To take the
//!   same lock from a shell: `flock /dir/P~K.lock command`
//!   ([`FileBackend::lock_path`] gives the path).
//! - `P~K.fence`: the last fencing token, a decimal number.
//!
//! **Lock files stay** after a release: deleting one while another process
//! waits on it would let that process lock a file nobody else can reach,
//! and a third process create a new one at the same name: two holders.
//! (dlock itself checks, after each `flock`, that the file it locked is
//! still the one at the name, and opens the new one if not; `flock(1)`
//! does not.) A directory holds two small files per key ever locked;
//! delete them only when no process uses the keys.
//!
//! # Protocol
//!
//! - `try_acquire`: open (create) the lock file, `flock(LOCK_EX|LOCK_NB)`,
//!   check the locked file is still the one at its name (same device and
//!   inode; else drop it and start again), count the fence (below), write
//!   the record. Separate opens conflict even within one process, so two
//!   leases on one key in one process exclude each other.
//! - Fencing tokens: read `P~K.fence`, write `max(last + 1, the wall clock
//!   in µs)` over it in place (one fixed-width line of 21 bytes at offset
//!   0), while holding the lock. Strictly increasing per key across holders
//!   and processes; a holder killed mid-write leaves the old line or the
//!   new one (the kernel copies a write within one page in one piece). Not
//!   a temporary file renamed over the counter: on ext4 that rename flushes
//!   the file's data first, about 200 µs a grant. No `fsync`: after a power
//!   failure the clock floor keeps tokens above every earlier one, unless
//!   the clock goes back.
//! - `acquire` waits without polling: an inotify watch on the lock file
//!   wakes it when any process closes it (a release, `flock(1)` exiting,
//!   the kernel closing a killed holder's files) or the file is removed or
//!   replaced; then it tries again. A re-check every second catches what
//!   sends no event (`flock -u` without closing). One inotify instance
//!   and one thread blocked reading it serve the whole process
//!   (`watch.rs`). A waiter holds one open file and one watch, no thread
//!   of its own: a dropped or timed-out `acquire` closes them, and leaves
//!   nothing locked. Waiters of several processes
//!   are not served in arrival order: whoever tries first after a release
//!   takes the lock (the kernel's own `flock` queue is not used, since a
//!   blocking `flock` cannot be cancelled).
//! - `release`: empty the record, `LOCK_UN`, close (the close wakes the
//!   waiters).
//! - A lease is the holder process's life, as on PostgreSQL: the kernel
//!   frees the lock when the process dies, whatever the ttl. The ttl is the
//!   cadence of the local watchdog's check: a renewal checks that the lock
//!   file at the name is still the one held (not removed, not replaced by
//!   an operator) and moves the record's expiry; a lease whose file is gone
//!   or replaced is lost (`lost()` fires, [`Renewal::Deleted`]).
//!   Each holder also watches its lock file's inode and the directory
//!   (inotify, `watch.rs`): a removal, move or change of either rings the
//!   loss alarm (`LockBackend::loss_alarm`), so the renewal runs, and
//!   `lost()` fires, within milliseconds rather than a third of the ttl.
//!   A lease not renewed within its ttl (renewal off, a leaked guard, a
//!   stalled watchdog) is let go by the backend, as a server would expire
//!   it.
//! - `inspect` and `list` (plain locks) read `/proc/locks` (which process holds a
//!   `flock` on which inode) and the record; a lock held by a process that
//!   is not dlock, or whose record is another process's, shows no holder,
//!   fence or time left. `force_release` cannot take a kernel lock from
//!   another process: it replaces the held lock file by a new, empty one
//!   (a rename), so the next acquirer locks the new file, the holder's
//!   next renewal finds its file replaced and reports the loss, and the
//!   fence counter (a separate file) goes on. A `flock(1)` holder or
//!   waiter of the old file is not told: like every forced release, it
//!   lets the evicted holder's work overlap the next holder's.
//!
//! # Read-write locks
//!
//! [`RwLock`](crate::RwLock) takes `<prefix>~rw~<key>.lock`, a file apart
//! from the plain lock's: readers with `flock(LOCK_SH)`, writers with
//! `LOCK_EX`. A waiting writer holds the gate file `<prefix>~rw~<key>.gate`
//! exclusively until it is granted, and readers pass the gate (shared, for
//! an instant) first, so readers that come after a waiting writer stay out.
//! Write fences come from `<prefix>~rw~<key>.fence`; a read's fence is the
//! last write's. `flock -s` on the file reads, `flock` writes (without the
//! gate). See the `rw` module's docs.
//!
//! # Semaphores
//!
//! [`Semaphore`](crate::Semaphore) `name` of N permits: N slot files
//! `<prefix>~sem~<name>~<i>.lock`, a permit being `flock(LOCK_EX)` on the
//! first free one (the kernel frees a dead holder's), and the count file
//! `<prefix>~sem~<name>~count`, holding the number, which every holder
//! keeps `flock(LOCK_SH)` on: the number is written only under `LOCK_EX`,
//! so it may change only once every permit is back, and a caller with
//! another count meanwhile is refused. Waiters are woken by inotify on the
//! slot and count files. See the `permits` module's docs.
//!
//! # Elections
//!
//! [`Election`](crate::Election) `name` is the plain lock of that name, its
//! fence the term; the leader's record (term and value) is
//! `<prefix>~<name>.leader`, written (a temporary file renamed into place)
//! only while the lease holds the lock, and shown by `leader()` only while
//! the lock is held with that term as its fence. Observers are woken by
//! inotify on the directory and the lock file and read the leader (a term
//! shorter than a read may be missed). See the `election` module's docs.
//!
//! # Limits
//!
//! - **Local file systems only.** `flock` excludes processes of one
//!   kernel. `connect` refuses a directory on NFS, SMB/CIFS, 9p, CephFS,
//!   AFS, GFS2, OCFS2, Lustre and network FUSE file systems (sshfs, rclone,
//!   s3fs, …), naming the file system; one it does not know is taken as
//!   local. Containers share locks when they share the directory (a bind
//!   mount of one host directory) and the kernel.
//! - A semaphore has at most 1,024 permits (one slot file each, which a
//!   waiter keeps open and watched).
//! - File system calls run on the calling task: local file systems answer
//!   in microseconds.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
//! let locks = dlock::connect("file:///var/lock/myapp").await?;
//! let guard = dlock::Lock::new("nightly-report").with_backend(locks).acquire().await?;
//! // `flock -n /var/lock/myapp/dlock~nightly-report.lock true` now fails.
//! guard.release().await?;
//! # Ok(()) }
//! ```

// The files of this backend, by concern (what ARCHITECTURE.md's "Inside a backend"
// table points to):
// - URL / configuration: `config.rs` (the absolute directory, `?prefix=`, `?client_name=`, `?mode=`)
// - local file systems only: `fs_kind.rs` (`statfs` magic numbers, FUSE subtypes)
// - a key's file names: `names.rs` (escaping, hashed long keys, reading a name back)
// - one lock file's system calls: `lock_file.rs` (open/create with the mode, `flock`, the
//   same-file check, the fence counter, the holder's record)
// - waiting in line: `watch.rs` (the process's inotify instance, a `Notify` per watched file),
//   `waiting.rs` (the attempt and the wait loop)
// - held leases, renewal, the reaper of leases past their ttl: `held.rs` (with the holder's
//   inotify watch on its file and the directory, `watch.rs`'s `LossWatch`)
// - which files to trust (owner, mode, kind; fence counters; random temporary names): `trust.rs`
// - read-write locks (`RwBackend`): `rw.rs` (the shared/exclusive lock file, the writers' gate)
// - semaphores (`PermitBackend`): `permits.rs` (slot files, the count file held shared)
// - elections (`ElectionBackend`): `election.rs` (the leader record beside the lock file,
//   observers woken by inotify on the directory and the lock file)
// - count-down latches (`LatchBackend`): `latch.rs` (the count file, renamed into place, counted
//   down under `flock`; waiters woken by inotify on the directory)
// - double barriers (`BarrierBackend`): `barrier.rs` (member files locked and leased like permits,
//   the `ready` file of Curator's layout; waiters woken by inotify on the directory)
// - the operator's view: `inspect.rs` (`/proc/locks`, the records; `force_release` by replacing)
mod barrier;
mod config;
mod election;
mod fs_kind;
mod held;
mod inspect;
mod latch;
mod line;
mod lock_file;
mod names;
mod permits;
mod rw;
mod semaphore_inspect;
mod trust;
mod waiting;
mod watch;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use rustix::io::Errno;

use crate::backend::{AcquireRequest, Capabilities, Lease, LockBackend, Renewal};
use crate::{LockError, LockInfo};

/// Locks on the files of one local directory. See the [module docs](self).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::backends::file::FileBackend;
/// let files = FileBackend::connect("file:///run/lock/myapp?prefix=jobs").await?;
/// assert!(files.lock_path("nightly").ends_with("jobs~nightly.lock"));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FileBackend {
    config: config::Config,
    /// The directory, opened once: every file is reached relative to it.
    dir: OwnedFd,
    /// Which files dlock uses (owner, mode, kind) and the fences it issued.
    trust: trust::Trust,
    /// The leases this backend holds, by owner token.
    held: Arc<Mutex<held::HeldMap>>,
    /// The loss alarm (`LockBackend::loss_alarm`), rung by the watches on
    /// held files and on the directory (`watch.rs`).
    alarm: watch::Alarm,
    /// The watch on the directory, started at the first lease.
    dir_watch: std::sync::OnceLock<Option<watch::LossWatch>>,
}

impl FileBackend {
    /// Opens the directory of a `file:///path/to/dir` URL (see the
    /// [module docs](self) for its parameters).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] naming the URL when it is not an
    /// absolute `file://` URL, takes an unknown parameter, or names a
    /// directory that is missing, not a directory, not writable, or on a
    /// network file system.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = config::parse(url)?;
        let bad = |why: String| LockError::invalid_option(format!("`{}`: {why}", config.shown));
        let dir = &config.dir;
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(bad(format!(
                    "`{}` is not a directory; name the directory the lock files go in",
                    dir.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(format!(
                    "the directory `{}` does not exist; create it (`mkdir -p {}`), or name an existing one",
                    dir.display(),
                    dir.display()
                )))
            }
            Err(e) => return Err(bad(format!("cannot reach `{}`: {e}", dir.display()))),
        }
        fs_kind::check_local(dir).map_err(|why| bad(format!("`{}`: {why}", dir.display())))?;
        let access = rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK;
        rustix::fs::access(dir, access).map_err(|e| {
            bad(format!(
                "cannot create files in `{}` ({e}); give this user write access to it, or name another directory",
                dir.display()
            ))
        })?;
        let flags = rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::CLOEXEC;
        let dir_fd = rustix::fs::open(dir, flags, rustix::fs::Mode::empty())
            .map_err(|e| bad(format!("cannot open `{}`: {e}", dir.display())))?;
        let stat = rustix::fs::fstat(&dir_fd)
            .map_err(|e| bad(format!("cannot stat `{}`: {e}", dir.display())))?;
        if stat.st_mode & 0o002 != 0 && !config.shared_dir {
            // Any user may create files in it: plant a lock file before
            // dlock does, or a FIFO, or take names away.
            return Err(bad(format!(
                "`{}` is writable by every user (mode {:04o}, owner {}): any user could create the lock files first, read the records or move files away; use a directory of your own (e.g. `mkdir -m 0700 /run/user/$UID/locks`, or `/var/lock/myapp` made by your service), or, if you accept that other users can deny you locks (dlock still refuses every file it did not make or that others can write), add `?shared_dir=accept`",
                dir.display(),
                stat.st_mode & 0o7777,
                trust::owner_name(stat.st_uid),
            )));
        }
        Ok(FileBackend {
            trust: trust::Trust::new(config.mode, stat.st_gid),
            config,
            dir: dir_fd,
            held: Arc::default(),
            alarm: Arc::new(tokio::sync::watch::channel(0).0),
            dir_watch: std::sync::OnceLock::new(),
        })
    }

    /// The lock file of `key`: what `flock(1)` locks to take the same lock.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let files = dlock::backends::file::FileBackend::connect("file:///var/lock/myapp").await?;
    /// assert_eq!(files.lock_path("a/b"), std::path::Path::new("/var/lock/myapp/dlock~a%2Fb.lock"));
    /// # Ok(()) }
    /// ```
    pub fn lock_path(&self, key: &str) -> PathBuf {
        self.config.dir.join(self.lock_name(key))
    }

    /// The stem of `key`'s files.
    fn stem(&self, key: &str) -> String {
        names::stem(&self.config.prefix, key)
    }

    /// The lock file's name of `key`, inside the directory.
    fn lock_name(&self, key: &str) -> String {
        format!("{}{}", self.stem(key), names::LOCK)
    }

    /// A failed system call on `name` as a backend error that names the
    /// file and what to check.
    fn failed(&self, what: &str, name: &str, e: impl Into<lock_file::FileError>) -> LockError {
        let path = self.config.dir.join(name);
        let e = match e.into() {
            lock_file::FileError::Sys(e) => e,
            lock_file::FileError::Untrusted(why) => {
                return LockError::backend(
                    self.describe(),
                    std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("{what} in `{}`: {}", self.config.dir.display(), why.0),
                    ),
                )
            }
        };
        let hint = match e {
            Errno::ACCESS | Errno::PERM => format!(
                "; check the owner and mode of the file and of its directory (dlock creates files with mode {:04o}, `?mode=`)",
                self.config.mode
            ),
            Errno::LOOP => "; the name is a symbolic link, which dlock does not follow: remove it".to_owned(),
            Errno::NOSPC | Errno::DQUOT => "; the file system is full".to_owned(),
            _ => String::new(),
        };
        LockError::backend(
            self.describe(),
            std::io::Error::new(
                std::io::Error::from(e).kind(),
                format!("{what} `{}`: {e}{hint}", path.display()),
            ),
        )
    }
}

#[async_trait]
impl LockBackend for FileBackend {
    fn describe(&self) -> String {
        self.config.shown.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        Ok(match self.attempt(req, None)? {
            waiting::Attempt::Taken(lease) => Some(lease),
            waiting::Attempt::Busy(_) => None,
        })
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.wait_for(req, deadline).await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        leases.iter().map(|lease| self.renew_one(lease)).collect()
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.let_go(&lease.token))
    }

    fn client_name(&self) -> Option<&str> {
        self.config.client_name.as_deref()
    }

    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.alarm.subscribe())
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            latch: Some(self),
            barrier: Some(self),
            ..Capabilities::all(self)
        }
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.inspect_key(key)
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        self.force_release_key(key)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, LockInfo)>, LockError> {
        self.list_keys(prefix)
    }
}
