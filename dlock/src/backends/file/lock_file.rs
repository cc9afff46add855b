//! One lock file's system calls: open (creating it with the configured
//! mode), `flock(2)` without blocking, whether an open file is still the
//! one at its name, the fence counter beside it, and the holder's record
//! inside it.
//!
//! Every call is relative to the directory's descriptor (`openat`,
//! `statat`, `renameat`) and refuses to follow a symbolic link at the
//! name (`O_NOFOLLOW`), so neither a key nor a link planted in the
//! directory reaches a file outside it.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt as _;
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use super::names;
use super::trust::{Trust, Untrusted};

/// A failed call on a lock file: a system call's error, or a file dlock
/// refuses to use (`trust.rs`).
#[derive(Debug)]
pub(super) enum FileError {
    Sys(Errno),
    Untrusted(Untrusted),
}

impl From<Errno> for FileError {
    fn from(e: Errno) -> Self {
        FileError::Sys(e)
    }
}

impl From<Untrusted> for FileError {
    fn from(e: Untrusted) -> Self {
        FileError::Untrusted(e)
    }
}

/// The flags of every open of a lock file: read and write (the record),
/// never a link, never inherited by a child process, never blocking (a
/// FIFO planted at the name would block an open or a read without it).
fn flags() -> OFlags {
    OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK
}

/// Opens the lock file `name` in `dir`, creating it with `trust.mode`
/// (exactly: `fchmod` after the create, so the umask does not narrow a
/// group's `0660`); a file found there must pass `trust`'s check.
pub(super) fn open(dir: &OwnedFd, name: &str, trust: &Trust) -> Result<File, FileError> {
    let mode = trust.mode;
    loop {
        match rustix::fs::openat(dir, name, flags(), Mode::empty()) {
            Err(Errno::NOENT) => {}
            Ok(fd) => {
                trust.check(&fd, name)?;
                return Ok(File::from(fd));
            }
            Err(e) => return Err(e.into()),
        }
        let create = flags() | OFlags::CREATE | OFlags::EXCL;
        match rustix::fs::openat(dir, name, create, Mode::from_raw_mode(mode)) {
            Ok(fd) => {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
                return Ok(File::from(fd));
            }
            // Another process created it first: open theirs.
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Creates a new file `<base>.<16 random hex digits>.tmp` in `dir`, with
/// `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600, then `trust.mode`: a
/// name nobody can create first, and a file nobody else opened. Gives the
/// file and its name.
pub(super) fn create_temporary(
    dir: &OwnedFd,
    base: &str,
    trust: &Trust,
) -> Result<(File, String), Errno> {
    let name = format!(
        "{base}.{}{}",
        super::trust::random_suffix(),
        names::TEMPORARY
    );
    let create = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::CREATE | OFlags::EXCL;
    let fd = rustix::fs::openat(dir, &name, create, Mode::from_raw_mode(0o600))?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(trust.mode))?;
    Ok((File::from(fd), name))
}

/// Opens the lock file `name` if it exists (no create): for the operator's
/// calls, which must not make files. Without blocking, and checked by
/// `trust` (a FIFO, another user's file: an error naming it).
pub(super) fn open_existing(
    dir: &OwnedFd,
    name: &str,
    trust: &Trust,
) -> Result<Option<File>, FileError> {
    match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => {
            trust.check(&fd, name)?;
            Ok(Some(File::from(fd)))
        }
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: `true` if taken, `false` if another open
/// file holds it.
pub(super) fn try_lock(file: &File) -> Result<bool, Errno> {
    try_flock(file, FlockOperation::NonBlockingLockExclusive)
}

/// `flock(LOCK_SH | LOCK_NB)`: `true` if taken, `false` if another open
/// file holds it exclusively.
pub(super) fn try_lock_shared(file: &File) -> Result<bool, Errno> {
    try_flock(file, FlockOperation::NonBlockingLockShared)
}

fn try_flock(file: &File, operation: FlockOperation) -> Result<bool, Errno> {
    match rustix::fs::flock(file, operation) {
        Ok(()) => Ok(true),
        Err(Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `flock(LOCK_UN)`: lets the lock go even if a copy of the descriptor
/// lives on somewhere (a forked child), before the close that wakes
/// waiters.
pub(super) fn unlock(file: &File) {
    let _ = rustix::fs::flock(file, FlockOperation::Unlock);
}

/// The device and inode of a file: what "the same file" means here.
pub(super) type Identity = (u64, u64);

/// The identity of an open file.
pub(super) fn identity(file: &impl AsFd) -> Result<Identity, Errno> {
    let stat = rustix::fs::fstat(file)?;
    #[allow(clippy::useless_conversion)]
    Ok((u64::from(stat.st_dev), u64::from(stat.st_ino)))
}

/// The identity of the file at `name` now; `None` if there is none.
pub(super) fn identity_at(dir: &OwnedFd, name: &str) -> Result<Option<Identity>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        #[allow(clippy::useless_conversion)]
        Ok(stat) => Ok(Some((u64::from(stat.st_dev), u64::from(stat.st_ino)))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `file` is still the file at `name` (not removed, not replaced).
pub(super) fn is_current(dir: &OwnedFd, name: &str, file: &File) -> Result<bool, Errno> {
    Ok(identity_at(dir, name)? == Some(identity(file)?))
}

/// Microseconds since the Unix epoch (0 for a clock before it).
fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Milliseconds since the Unix epoch.
pub(super) fn now_millis() -> u64 {
    now_micros() / 1_000
}

/// The width of the counter's one line (`u64::MAX` has 20 digits), so
/// that every write of it is the same bytes at the same place.
const COUNTER_LINE: usize = 21;

/// The next fencing token of the key whose files start with `stem`, kept
/// in `<stem>.fence`: `max(counter + 1, the clock in µs)`, written over the
/// counter in place as one fixed-width line. Called while holding the
/// lock, so no two holders count at once.
///
/// Why in place and not a temporary file renamed over the counter: on ext4
/// a rename that replaces a file flushes the new file's data first
/// (`auto_da_alloc`), about 200 µs a grant on this machine's disk, ten
/// times the rest of the cycle. A write of 21 bytes at offset 0 lies in one
/// page, which the kernel copies under the page's lock in one piece: a
/// holder killed mid-write leaves the old line or the new one, never a mix,
/// and two writers (a holder that lost its file racing the next) do not
/// interleave. Without `fsync` (a grant costs no disk flush), a power
/// failure may lose the last line or leave it torn: the clock floor keeps
/// the next token above every token given before it, as long as the clock
/// does not go back across the reboot.
///
/// A counter that is not a number, implausibly large, or below a token
/// this backend issued is an error (`trust.rs`), not a reset.
pub(super) fn next_fence(dir: &OwnedFd, stem: &str, trust: &Trust) -> Result<u64, FileError> {
    let counter = format!("{stem}{}", names::FENCE);
    let file = open(dir, &counter, trust)?;
    let text = read_file(&file)?;
    let last = trust.counter(stem, &text, &counter)?;
    // (`last` is below 2^63: `+ 1` cannot saturate.)
    let next = (last + 1).max(now_micros());
    let line = format!("{next:<width$}\n", width = COUNTER_LINE - 1);
    file.write_all_at(line.as_bytes(), 0)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
    if text.len() > COUNTER_LINE {
        // Longer text someone else wrote: cut it, so the file is the line.
        let _ = file.set_len(COUNTER_LINE as u64);
    }
    trust.issued(stem, next);
    Ok(next)
}

/// The last fencing token of the key whose files start with `stem`: 0
/// when there is none; a counter `trust` refuses is an error.
pub(super) fn last_fence(dir: &OwnedFd, stem: &str, trust: &Trust) -> Result<u64, FileError> {
    let counter = format!("{stem}{}", names::FENCE);
    match read_small(dir, &counter, trust)? {
        Some(text) => Ok(trust.counter(stem, &text, &counter)?),
        None => Ok(0),
    }
}

/// The text of a small file of `dir` (at most 4 KiB read); `None` if
/// there is no such file.
pub(super) fn read_small(
    dir: &OwnedFd,
    name: &str,
    trust: &Trust,
) -> Result<Option<String>, FileError> {
    let Some(file) = open_existing(dir, name, trust)? else {
        return Ok(None);
    };
    Ok(read_file(&file).map(Some)?)
}

/// Up to 4 KiB of an open file, from its start (a positioned read: the
/// descriptor's offset does not matter), as text (lossy).
pub(super) fn read_file(file: &File) -> Result<String, Errno> {
    let mut buf = [0u8; 4096];
    let n = file
        .read_at(&mut buf, 0)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// What a holder writes into the lock file while it holds it, for
/// `inspect` and `list` (and a person reading the file): the key (for a
/// hashed name), the client name, the process, the fence and the lease's
/// expiry by the wall clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) key: String,
    pub(super) holder: String,
    pub(super) pid: u32,
    pub(super) fence: u64,
    /// Milliseconds since the Unix epoch.
    pub(super) expires_ms: u64,
}

/// The record's first line.
const HEADER: &str = "dlock lock file: the process below holds it while it has flock(2) on it";

impl Record {
    /// The record as written: the expiry at a fixed width, so that a
    /// renewal rewrites the same bytes but those.
    pub(super) fn text(&self) -> String {
        format!(
            "{HEADER}\nkey={}\nholder={}\npid={}\nfence={}\nexpires_ms={:020}\n",
            self.key, self.holder, self.pid, self.fence, self.expires_ms
        )
    }

    /// Reads a record; `None` for an empty file or text dlock did not write.
    pub(super) fn parse(text: &str) -> Option<Record> {
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let mut field = |name: &str| {
            lines
                .next()
                .and_then(|line| line.strip_prefix(name))
                .and_then(|line| line.strip_prefix('='))
                .map(str::to_owned)
        };
        Some(Record {
            key: field("key")?,
            holder: field("holder")?,
            pid: field("pid")?.parse().ok()?,
            fence: field("fence")?.parse().ok()?,
            expires_ms: field("expires_ms")?.parse().ok()?,
        })
    }

    /// Writes the record at the start of `file`. What may follow it (a
    /// killed holder's longer record, never emptied) is after its last line,
    /// where [`parse`](Self::parse) does not read; a renewal rewrites the
    /// same length.
    pub(super) fn write(&self, file: &File) -> Result<(), Errno> {
        file.write_all_at(self.text().as_bytes(), 0)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
    }
}

/// Empties the lock file (the record of a holder that is letting go).
pub(super) fn clear(file: &File) {
    let _ = file.set_len(0);
}
