//! Leader election (`ElectionBackend`): the election `name` is the plain
//! lock of that name (its lock file, its fence as the term); the leader's
//! record is the file `<prefix>~<name>.leader` beside the lock file: the
//! term and the value.
//!
//! - `proclaim` writes the record only while the lease holds the lock
//!   (this backend keeps its `flock`ed lock file, still the one at the
//!   name), checked and written under the backend's map of held leases, so
//!   its reaper cannot let the lease go in between. The record is written
//!   whole into a temporary file (created with the backend's mode, 0600 by
//!   default) and renamed over the old one: a reader sees one record or
//!   the other, never half of one.
//! - `withdraw` removes the record if it is still the lease's (its term)
//!   and the lease still holds the lock.
//! - `leader` answers the record only while the lock is held with the
//!   record's term as its fence: `/proc/locks` names the process holding
//!   the lock file, whose own record in the lock file carries the fence
//!   (as `inspect` reads it). A crashed leader's record stays until the
//!   next leader's replaces it, and counts for nothing meanwhile.
//! - `watch` needs no polling: inotify on the directory (a record renamed
//!   into place or removed, a lock file created or replaced) and on the
//!   lock file (closed by a release, or by the kernel when the holder
//!   dies) wakes the observer, which reads the leader
//!   ([`LeaderChange::Unknown`]). A term that begins and ends between two
//!   reads is not reported; its successor is.
//! - `confirm` answers `false`: any process that may write in the
//!   directory may write a record, so announcements are only hints, and
//!   the observer reads for each one (they carry no record anyway).

use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;

use async_trait::async_trait;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::{names, watch, FileBackend};
use crate::backend::{
    ElectionBackend, Leader, LeaderChange, LeaderChanges, Lease, MAX_VALUE_BYTES,
};
use crate::LockError;

/// The record's first line.
const HEADER: &str =
    "dlock leader record: valid only while the lock beside it is held with this term";

/// A leader's record as written.
fn record_text(leader: &Leader) -> String {
    format!("{HEADER}\nterm={}\nvalue={}", leader.term, leader.value)
}

/// Reads a record; `None` for text dlock did not write.
fn parse_record(text: &str) -> Option<Leader> {
    let rest = text.strip_prefix(HEADER)?.strip_prefix('\n')?;
    let (term, rest) = rest.strip_prefix("term=")?.split_once('\n')?;
    let value = rest.strip_prefix("value=")?;
    Some(Leader {
        value: value.to_owned(),
        term: term.parse().ok()?,
    })
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

impl FileBackend {
    fn record_name(&self, name: &str) -> String {
        format!("{}{}", self.stem(name), names::LEADER)
    }

    /// The record of the election `name`, if there is one dlock wrote.
    fn read_record(&self, name: &str) -> Result<Option<Leader>, LockError> {
        let record = self.record_name(name);
        let fail = |e: Errno| self.failed("cannot read the leader record", &record, e);
        // Not blocking on a FIFO, and only a record of dlock's user.
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
        let file = match rustix::fs::openat(&self.dir, &record, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(fail(e)),
        };
        if let Err(why) = self.trust.check(&file, &record) {
            return Err(self.failed(
                "cannot read the leader record",
                &record,
                super::lock_file::FileError::Untrusted(why),
            ));
        }
        let mut bytes = Vec::new();
        let most = (HEADER.len() + MAX_VALUE_BYTES + 64) as u64;
        file.take(most)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(io_errno(&e)))?;
        Ok(std::str::from_utf8(&bytes).ok().and_then(parse_record))
    }

    /// Writes `leader` as the record of `name`: a temporary file renamed
    /// over the record.
    fn write_record(&self, name: &str, leader: &Leader) -> Result<(), LockError> {
        let record = self.record_name(name);
        let fail = |e: Errno| self.failed("cannot write the leader record", &record, e);
        // A name nobody can guess, created here (`O_EXCL`, mode 0600).
        let (file, temporary) =
            super::lock_file::create_temporary(&self.dir, &record, &self.trust).map_err(fail)?;
        let written = file
            .write_all_at(record_text(leader).as_bytes(), 0)
            .map_err(|e| io_errno(&e))
            .and_then(|()| rustix::fs::renameat(&self.dir, &temporary, &self.dir, &record));
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(&self.dir, &temporary, AtFlags::empty());
            return Err(fail(e));
        }
        Ok(())
    }

    /// Runs `then` under the map of held leases if `lease` is held by this
    /// backend as the plain lock it was granted (its file still the one at
    /// the name); `None` otherwise.
    fn while_holding<T>(
        &self,
        lease: &Lease,
        then: impl FnOnce() -> Result<T, LockError>,
    ) -> Result<Option<T>, LockError> {
        let held = super::held::lock(&self.held);
        let Some(entry) = held.get(&lease.token) else {
            return Ok(None);
        };
        let granted = entry.record.as_ref().map(|r| r.fence) == lease.fencing_token
            && lease.fencing_token.is_some();
        let current = super::lock_file::is_current(&self.dir, &entry.name, &entry.file)
            .map_err(|e| self.failed("cannot check the lock file", &entry.name, e))?;
        if !(granted && current) {
            return Ok(None);
        }
        then().map(Some)
    }
}

/// One observer's watches: the directory's entries and the lock file.
struct Changes {
    dir: PathBuf,
    lock: PathBuf,
    entries: Option<watch::Watch>,
    lock_watch: Option<watch::Watch>,
    /// The events of both watches already reported.
    seen: (u64, u64),
}

impl Changes {
    fn counts(&self) -> (u64, u64) {
        (
            self.entries.as_ref().map_or(0, watch::Watch::events),
            self.lock_watch.as_ref().map_or(0, watch::Watch::events),
        )
    }

    /// Follows the file now at the lock's name (a replaced or re-created
    /// lock file), before the caller reads.
    fn rewatch(&mut self) {
        if self.entries.is_none() {
            self.entries = watch::watch_entries(&self.dir).ok();
        }
        // The new watch is added before the old goes (one inode: one
        // descriptor, shared).
        let fresh = watch::watch(&self.lock).ok();
        self.lock_watch = fresh;
        self.seen = self.counts();
    }
}

#[async_trait]
impl LeaderChanges for Changes {
    async fn changed(&mut self) -> LeaderChange {
        let never = tokio::sync::Notify::new();
        loop {
            let news = {
                let entries = self.entries.as_ref().map_or(&never, watch::Watch::notify);
                let lock = self
                    .lock_watch
                    .as_ref()
                    .map_or(&never, watch::Watch::notify);
                let (entries, lock) = (entries.notified(), lock.notified());
                tokio::pin!(entries, lock);
                entries.as_mut().enable();
                lock.as_mut().enable();
                // Counted after the wake-ups are armed: an event since the
                // last answer (or since the watch was made) is not lost.
                if self.counts() != self.seen {
                    true
                } else if self.entries.is_none() {
                    // The directory's watch refused (the inotify limit):
                    // the safety re-check. (A missing lock file's creation
                    // is an event of the directory.)
                    tokio::time::sleep(super::waiting::RECHECK).await;
                    true
                } else {
                    tokio::select! {
                        () = &mut entries => {}
                        () = &mut lock => {}
                    }
                    false
                }
            };
            if news {
                self.rewatch();
                return LeaderChange::Unknown;
            }
        }
    }
}

#[async_trait]
impl ElectionBackend for FileBackend {
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool, LockError> {
        let Some(term) = lease.fencing_token else {
            return Ok(false);
        };
        let leader = Leader {
            value: value.to_owned(),
            term,
        };
        let written = self.while_holding(lease, || self.write_record(&lease.key, &leader))?;
        Ok(written.is_some())
    }

    async fn withdraw(&self, lease: &Lease) -> Result<(), LockError> {
        self.while_holding(lease, || {
            let ours = self
                .read_record(&lease.key)?
                .is_some_and(|r| Some(r.term) == lease.fencing_token);
            if ours {
                let record = self.record_name(&lease.key);
                match rustix::fs::unlinkat(&self.dir, &record, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => {
                        return Err(self.failed("cannot remove the leader record", &record, e))
                    }
                }
            }
            Ok(())
        })?;
        Ok(())
    }

    async fn leader(&self, name: &str) -> Result<Option<Leader>, LockError> {
        let Some(record) = self.read_record(name)? else {
            return Ok(None);
        };
        let fence = self.inspect_key(name)?.and_then(|info| info.fencing_token);
        Ok((fence == Some(record.term)).then_some(record))
    }

    async fn watch(&self, name: &str) -> Result<Box<dyn LeaderChanges>, LockError> {
        // The lock file exists from here on, so that it can be watched.
        let lock_name = self.lock_name(name);
        drop(
            super::lock_file::open(&self.dir, &lock_name, &self.trust)
                .map_err(|e| self.failed("cannot open the lock file", &lock_name, e))?,
        );
        let dir = self.config.dir.clone();
        let entries = watch::watch_entries(&dir)
            .map_err(|e| self.failed("cannot watch the directory (inotify)", "", e))?;
        let lock = dir.join(&lock_name);
        let mut changes = Changes {
            dir,
            lock,
            entries: Some(entries),
            lock_watch: None,
            seen: (0, 0),
        };
        changes.rewatch();
        Ok(Box::new(changes))
    }

    /// Never: any process that may write in the directory may write a
    /// record (the announcements are inotify events, which carry none).
    async fn confirm(&self, name: &str, change: &LeaderChange) -> Result<bool, LockError> {
        let _ = (name, change);
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_with_any_value() {
        for value in ["", "node-a:8080", "two\nlines", "term=1\nvalue=2", "ü"] {
            let leader = Leader {
                value: value.to_owned(),
                term: 42,
            };
            assert_eq!(parse_record(&record_text(&leader)), Some(leader));
        }
        assert_eq!(parse_record(""), None);
        assert_eq!(parse_record("term=1\nvalue=x"), None);
    }
}
