//! The operator's view: who holds a lock (`/proc/locks` for the process
//! holding a `flock` on the file, the record for what dlock wrote), the
//! held keys under a prefix, and a forced release by replacing the file.
//!
//! Nothing here takes a lock or creates a file: reading `/proc/locks`
//! disturbs no holder or waiter (a probing `flock` could make another
//! process's `flock -n` fail). Without `/proc/locks` (no procfs), a probe
//! with `LOCK_SH | LOCK_NB` on a read-only open tells held from free.

use std::collections::HashMap;
use std::fs::File;
use std::time::Duration;

use rustix::fs::FlockOperation;
use rustix::io::Errno;

use super::lock_file::{self, Identity, Record};
use super::names::{self, Named};
use super::FileBackend;
use crate::backend::holder::{too_many_to_list, MAX_LISTED};
use crate::backend::LockBackend;
use crate::{LockError, LockInfo};

/// The `flock` locks of the system: inode → the pid holding it exclusively
/// (0 when the holder is outside this pid namespace), or `None` without
/// `/proc/locks`.
pub(super) fn flock_holders() -> Option<HashMap<Identity, u32>> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    Some(parse_proc_locks(&text))
}

/// Reads `/proc/locks`' lines: `1: FLOCK  ADVISORY  WRITE 4242 08:02:1311 0 EOF`
/// (device as hex major:minor). Waiters' lines (`1: -> FLOCK …`), shared
/// and other kinds of lock are left out.
fn parse_proc_locks(text: &str) -> HashMap<Identity, u32> {
    let mut held = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace().skip(1);
        let (Some("FLOCK"), Some(_), Some("WRITE"), Some(pid), Some(file)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let mut parts = file.split(':');
        let (Some(major), Some(minor), Some(inode), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (Ok(major), Ok(minor), Ok(inode)) = (
            u32::from_str_radix(major, 16),
            u32::from_str_radix(minor, 16),
            inode.parse::<u64>(),
        ) else {
            continue;
        };
        let dev = rustix::fs::makedev(major, minor);
        #[allow(clippy::useless_conversion)]
        held.insert((u64::from(dev), inode), pid.parse().unwrap_or(0));
    }
    held
}

/// Whether `file` is locked by another open file (the fallback without
/// `/proc/locks`): a shared lock is refused only by an exclusive one.
pub(super) fn probed_held(file: &File) -> Result<bool, Errno> {
    match rustix::fs::flock(file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = rustix::fs::flock(file, FlockOperation::Unlock);
            Ok(false)
        }
        Err(Errno::WOULDBLOCK) => Ok(true),
        Err(e) => Err(e),
    }
}

/// What `inspect` shows of a held file: the record if the process that
/// holds the lock wrote it (by `/proc/locks`' pid; the record alone when
/// that is unknown), else a holder that is not dlock: no name, fence or
/// time.
fn info(record: Option<Record>, holder_pid: Option<u32>) -> LockInfo {
    match record {
        Some(r) if holder_pid.is_none_or(|pid| pid == r.pid) => {
            let left = r.expires_ms.saturating_sub(lock_file::now_millis());
            LockInfo::new(
                Duration::from_millis(left),
                Some(r.fence),
                Some(r.holder).filter(|h| !h.is_empty()),
            )
        }
        _ => LockInfo::new(Duration::ZERO, None, None),
    }
}

impl FileBackend {
    /// Reads the held lock file `name`: `None` when it is free or missing.
    fn held_file(
        &self,
        name: &str,
        holders: Option<&HashMap<Identity, u32>>,
    ) -> Result<Option<(LockInfo, Option<Record>)>, LockError> {
        let fail = |e: lock_file::FileError| self.failed("cannot read the lock file", name, e);
        let Some(file) = lock_file::open_existing(&self.dir, name, &self.trust).map_err(fail)?
        else {
            return Ok(None);
        };
        let pid = match holders {
            Some(holders) => {
                match holders.get(&lock_file::identity(&file).map_err(|e| fail(e.into()))?) {
                    Some(pid) => Some(*pid),
                    None => return Ok(None),
                }
            }
            None if probed_held(&file).map_err(|e| fail(e.into()))? => None,
            None => return Ok(None),
        };
        let record = Record::parse(&lock_file::read_file(&file).map_err(|e| fail(e.into()))?);
        Ok(Some((info(record.clone(), pid), record)))
    }

    pub(super) fn inspect_key(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let holders = flock_holders();
        Ok(self
            .held_file(&self.lock_name(key), holders.as_ref())?
            .map(|(info, _)| info))
    }

    /// Replaces a held lock file by a new, empty one: `false` if it is free.
    pub(super) fn force_release_key(&self, key: &str) -> Result<bool, LockError> {
        let name = self.lock_name(key);
        let fail = |e: lock_file::FileError| self.failed("cannot replace the lock file", &name, e);
        let Some(file) = lock_file::open_existing(&self.dir, &name, &self.trust).map_err(fail)?
        else {
            return Ok(false);
        };
        if lock_file::try_lock(&file).map_err(|e| fail(e.into()))? {
            // Free (held now by this probe, let go with the close).
            lock_file::unlock(&file);
            return Ok(false);
        }
        // A new file under a name nobody can guess, created here
        // (`O_EXCL`): never a file another user made ready.
        let (created, fresh) =
            lock_file::create_temporary(&self.dir, &format!("{name}.forced"), &self.trust)
                .map_err(|e| fail(e.into()))?;
        drop(created);
        if let Err(e) = rustix::fs::renameat(&self.dir, &fresh, &self.dir, &name) {
            let _ = rustix::fs::unlinkat(&self.dir, &fresh, rustix::fs::AtFlags::empty());
            return Err(fail(e.into()));
        }
        Ok(true)
    }

    /// The directory's entries, for a listing.
    pub(super) fn entries(&self) -> Result<std::fs::ReadDir, LockError> {
        std::fs::read_dir(&self.config.dir).map_err(|e| {
            LockError::backend(
                self.describe(),
                std::io::Error::new(
                    e.kind(),
                    format!("cannot list `{}`: {e}", self.config.dir.display()),
                ),
            )
        })
    }

    pub(super) fn list_keys(&self, prefix: &str) -> Result<Vec<(String, LockInfo)>, LockError> {
        let holders = flock_holders();
        let entries = self.entries()?;
        let mut listed = Vec::new();
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                continue;
            };
            let Some(named) = names::key_of(&self.config.prefix, name) else {
                continue;
            };
            if let Named::Key(key) = &named
                && !key.starts_with(prefix)
            {
                continue;
            }
            let Some((info, record)) = self.held_file(name, holders.as_ref())? else {
                continue;
            };
            let key = match named {
                Named::Key(key) => key,
                // A hashed name: the key is the record's, if it is this file's.
                Named::Hashed => match record {
                    Some(r) if self.lock_name(&r.key) == name && r.key.starts_with(prefix) => r.key,
                    _ => continue,
                },
            };
            if listed.len() == MAX_LISTED {
                return Err(too_many_to_list(&self.describe(), prefix));
            }
            listed.push((key, info));
        }
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_exclusive_flock_lines_only() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 08:02:1311 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 4243 08:02:1311 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 99 00:2e:77 0 EOF\n\
                    3: FLOCK  ADVISORY  READ  7 00:2e:78 0 EOF\n\
                    4: OFDLCK ADVISORY  WRITE -1 00:2e:79 0 EOF\n\
                    5: FLOCK  ADVISORY  WRITE 8 fd:01:80 0 EOF\n";
        let held = parse_proc_locks(text);
        assert_eq!(held.len(), 2, "{held:?}");
        #[allow(clippy::useless_conversion)]
        let dev = u64::from(rustix::fs::makedev(8, 2));
        assert_eq!(held.get(&(dev, 1311)), Some(&4242));
        #[allow(clippy::useless_conversion)]
        let dev = u64::from(rustix::fs::makedev(0xfd, 1));
        assert_eq!(held.get(&(dev, 80)), Some(&8));
    }

    #[test]
    fn a_record_of_another_process_is_not_the_holders() {
        let record = Record {
            key: "k".into(),
            holder: "cron".into(),
            pid: 10,
            fence: 7,
            expires_ms: lock_file::now_millis() + 5_000,
        };
        let mine = info(Some(record.clone()), Some(10));
        assert_eq!(
            (mine.holder.as_deref(), mine.fencing_token),
            (Some("cron"), Some(7))
        );
        assert!(mine.remaining > Duration::from_secs(4));
        let foreign = info(Some(record), Some(11));
        assert_eq!(foreign, LockInfo::new(Duration::ZERO, None, None));
        assert_eq!(info(None, None), LockInfo::new(Duration::ZERO, None, None));
    }
}
