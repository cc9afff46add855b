//! Count-down latches (`LatchBackend`): the latch `name` is the count file
//! `<prefix>~latch~<name>.count`, which exists only while the count is
//! live (removed when it reaches zero), holding the count as one
//! fixed-width decimal line.
//!
//! - `try_set_count` writes the count into a temporary file (random name,
//!   `O_EXCL`, the backend's mode) and renames it into place with
//!   `RENAME_NOREPLACE` (`linkat` where the file system refuses that
//!   flag): one atomic step that fails while a count is live.
//! - `count_down` opens the count file, takes `flock(LOCK_EX)` on it (on a
//!   blocking thread: the lock is held for microseconds, and a dropped call
//!   drops the file with the lock), checks it is still the file at the
//!   name (a count that reached zero and was set again is another file),
//!   and writes `count - 1` over the line in place, or removes the file
//!   when the count was one. In place, not renamed, since the `flock` is
//!   on the inode; as for
//!   the fence counter (`lock_file.rs`), a write of one line at offset 0
//!   is seen whole by readers. No `fsync`, as elsewhere in this backend: a
//!   power failure may lose the last step.
//! - `wait_zero` is woken by inotify on the directory (`watch.rs`: the
//!   count file removed, or renamed into place), armed before it reads the
//!   count, so a removal between its read and its wait is not missed. The
//!   directory's watch is one inotify watch of the process, shared by every
//!   waiter of every latch (and with the holders' watch of the directory);
//!   a dropped wait drops its share. Only if inotify refuses (its limit) or
//!   its reader stopped does a waiter re-read every second.
//!
//! Every file is checked as the backend's others are (`trust.rs`: a
//! regular file of dlock's user, writable by no one else); a count file
//! that holds no number is an error naming it, not a reset.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::time::Instant;

use async_trait::async_trait;
use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::lock_file::{self, FileError};
use super::waiting::RECHECK;
use super::{names, watch, FileBackend};
use crate::backend::LatchBackend;
use crate::LockError;

/// The width of the count's one line (`u64::MAX` has 20 digits), so every
/// write of it is the same bytes at the same place.
const COUNT_LINE: usize = 21;

/// How many times a count-down opens the count file again because it was
/// replaced between the open and the lock.
const REOPENS: usize = 64;

fn count_line(count: u64) -> String {
    format!("{count:<width$}\n", width = COUNT_LINE - 1)
}

/// The count in a count file's text: `None` for anything but a number.
fn parse_count(text: &str) -> Option<u64> {
    text.lines().next()?.trim().parse().ok()
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

impl FileBackend {
    fn latch_file(&self, name: &str) -> String {
        format!(
            "{}{}",
            names::latch_stem(&self.config.prefix, name),
            names::COUNT
        )
    }

    /// Opens the count file for reading and writing, if there is one, and
    /// checks it as every file of the backend.
    fn open_count(&self, file: &str) -> Result<Option<File>, LockError> {
        let fail = |e: FileError| self.failed("cannot open the latch's count file", file, e);
        let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
        let opened = match rustix::fs::openat(&self.dir, file, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(fail(e.into())),
        };
        self.trust
            .check(&opened, file)
            .map_err(|why| fail(why.into()))?;
        Ok(Some(opened))
    }

    /// The count in the open count file `file` (named `name`).
    fn read_latch(&self, name: &str, file: &File) -> Result<u64, LockError> {
        let text = lock_file::read_file(file)
            .map_err(|e| self.failed("cannot read the latch's count file", name, e))?;
        parse_count(&text).ok_or_else(|| {
            self.failed(
                "the latch's count file holds no count (not written by dlock?); remove it to reset the latch",
                name,
                Errno::INVAL,
            )
        })
    }

    /// The live count of the latch whose count file is `name`: 0 when none.
    fn latch_count(&self, name: &str) -> Result<u64, LockError> {
        match self.open_count(name)? {
            Some(file) => self.read_latch(name, &file),
            None => Ok(0),
        }
    }

    /// Renames the written temporary file `temporary` to `name` unless a
    /// file is there: `Ok(false)` if one is.
    pub(super) fn place_new(&self, temporary: &str, name: &str) -> Result<bool, Errno> {
        match rustix::fs::renameat_with(
            &self.dir,
            temporary,
            &self.dir,
            name,
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => return Ok(true),
            Err(Errno::EXIST) => return Ok(false),
            // A file system without `RENAME_NOREPLACE`: a hard link is
            // just as atomic, and fails on a name that exists.
            Err(Errno::INVAL | Errno::NOSYS) => {}
            Err(e) => return Err(e),
        }
        match rustix::fs::linkat(&self.dir, temporary, &self.dir, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One count-down on the locked `file`, still the one at `name`.
    fn step_down(&self, name: &str, file: &File) -> Result<(), LockError> {
        let fail = |e: Errno| self.failed("cannot count down the latch", name, e);
        match self.read_latch(name, file)? {
            0 | 1 => match rustix::fs::unlinkat(&self.dir, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(fail(e)),
            },
            count => file
                .write_all_at(count_line(count - 1).as_bytes(), 0)
                .map_err(|e| fail(io_errno(&e))),
        }
    }
}

/// `flock(LOCK_EX)` on `file`, on a blocking thread: the file back, locked.
async fn lock_exclusive(file: File) -> Result<File, Errno> {
    tokio::task::spawn_blocking(move || {
        rustix::fs::flock(&file, FlockOperation::LockExclusive).map(|()| file)
    })
    .await
    .unwrap_or(Err(Errno::INTR))
}

#[async_trait]
impl LatchBackend for FileBackend {
    async fn try_set_count(&self, name: &str, count: u64) -> Result<bool, LockError> {
        let file = self.latch_file(name);
        let fail = |e: Errno| self.failed("cannot set the latch's count", &file, e);
        let (temp, temporary) =
            lock_file::create_temporary(&self.dir, &file, &self.trust).map_err(fail)?;
        let placed = temp
            .write_all_at(count_line(count).as_bytes(), 0)
            .map_err(|e| io_errno(&e))
            .and_then(|()| self.place_new(&temporary, &file));
        // After a rename there is nothing left at the temporary name; after
        // a link or a refusal, the temporary file goes.
        let _ = rustix::fs::unlinkat(&self.dir, &temporary, AtFlags::empty());
        placed.map_err(fail)
    }

    async fn count_down(&self, name: &str) -> Result<(), LockError> {
        let file_name = self.latch_file(name);
        let fail = |e: Errno| self.failed("cannot lock the latch's count file", &file_name, e);
        for _ in 0..REOPENS {
            let Some(file) = self.open_count(&file_name)? else {
                return Ok(());
            };
            let file = lock_exclusive(file).await.map_err(fail)?;
            // A file removed (the count reached zero) or replaced (set
            // again) since the open is no longer the latch's count.
            if lock_file::is_current(&self.dir, &file_name, &file).map_err(fail)? {
                return self.step_down(&file_name, &file);
            }
        }
        Err(self.failed(
            "cannot count down the latch: its count file was replaced at every try",
            &file_name,
            Errno::AGAIN,
        ))
    }

    async fn count(&self, name: &str) -> Result<u64, LockError> {
        self.latch_count(&self.latch_file(name))
    }

    async fn wait_zero(&self, name: &str, deadline: Option<Instant>) -> Result<bool, LockError> {
        let file = self.latch_file(name);
        if self.latch_count(&file)? == 0 {
            return Ok(true);
        }
        let mut entries = watch::EntriesWaiter::new(&self.config.dir);
        loop {
            entries.refresh(&self.config.dir);
            let woken = entries.notify().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Read after the watch is armed: a removal from here on wakes it.
            if self.latch_count(&file)? == 0 {
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Ok(false);
            }
            // Without a live watch: the re-check every second, as for locks.
            let nap = match (entries.watching(), deadline) {
                (true, d) => d,
                (false, d) => Some(d.map_or(now + RECHECK, |d| d.min(now + RECHECK))),
            };
            match nap {
                Some(nap) => {
                    tokio::select! {
                        () = &mut woken => {}
                        () = tokio::time::sleep_until(nap.into()) => {}
                    }
                }
                None => woken.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{count_line, parse_count, COUNT_LINE};

    #[test]
    fn a_count_is_one_fixed_width_line() {
        assert_eq!(count_line(3).len(), COUNT_LINE);
        assert_eq!(count_line(u64::MAX).len(), COUNT_LINE);
        assert_eq!(parse_count(&count_line(42)), Some(42));
        assert_eq!(parse_count(""), None);
        assert_eq!(parse_count("three\n"), None);
    }
}
