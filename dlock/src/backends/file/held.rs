//! The leases this backend holds (owner token → the locked file), their
//! renewal (the file at the name is still the one locked), their release,
//! and the reaper that lets a lease go when its local deadline passes
//! without a renewal, as a server would expire it.

use std::collections::HashMap;
use std::fs::File;
use std::time::{Duration, Instant};

use super::lock_file::{self, Record};
use super::FileBackend;
use crate::backend::{lease_deadline, Lease, Renewal};
use crate::backends::held_deadline;
use crate::LockError;

/// A held lease.
#[derive(Debug)]
pub(super) struct Held {
    /// The locked lock file; closing it frees the lock.
    pub(super) file: File,
    /// The lock file's name in the directory.
    pub(super) name: String,
    /// The holder's record, written in the file; `None` for a read-write
    /// lock's lease (its file is shared by readers).
    pub(super) record: Option<Record>,
    /// More files the lease keeps locked, and their names: a permit's
    /// other slots and its shared lock on its semaphore's count file.
    /// Closed after `file`, in order.
    pub(super) companions: Vec<(File, String)>,
    pub(super) ttl: Duration,
    pub(super) valid_until: Instant,
    /// The watch on the held file that rings the backend's loss alarm when
    /// it is removed, moved or changed (`None`: inotify refused; renewals
    /// still find the loss).
    _loss_watch: Option<super::watch::LossWatch>,
    /// Dropped with the entry: ends its reaper's wait.
    _gone: tokio::sync::oneshot::Sender<()>,
}

pub(super) type HeldMap = HashMap<String, Held>;

/// Empties the record, unlocks and closes: the close wakes the waiters of
/// every process.
fn let_go_of(held: Held) {
    if held.record.is_some() {
        lock_file::clear(&held.file);
    }
    lock_file::unlock(&held.file);
    drop(held.file);
    for (file, _) in held.companions {
        lock_file::unlock(&file);
    }
}

pub(super) fn lock(map: &std::sync::Mutex<HeldMap>) -> std::sync::MutexGuard<'_, HeldMap> {
    // Every update is one insert, remove or assignment.
    map.lock().unwrap_or_else(|p| p.into_inner())
}

impl FileBackend {
    /// Registers a taken lock file as the lease of `token`, and starts its
    /// reaper.
    pub(super) fn hold(
        &self,
        token: &str,
        file: File,
        name: String,
        record: Option<Record>,
        ttl: Duration,
        valid_until: Instant,
    ) {
        self.watch_directory();
        let loss_watch = match super::watch::watch_for_loss(&file, &self.alarm) {
            Ok(watch) => Some(watch),
            Err(e) => {
                tracing::debug!(file = name, error = %e, "cannot watch the held lock file; its loss is found by renewals");
                None
            }
        };
        // Removed or replaced between the grant's check and the watch: the
        // watch saw nothing, so ring now (the renewal reports the loss).
        if !matches!(lock_file::is_current(&self.dir, &name, &file), Ok(true)) {
            super::watch::ring(&self.alarm);
        }
        let entry = |gone| Held {
            file,
            name,
            record,
            companions: Vec::new(),
            ttl,
            valid_until,
            _loss_watch: loss_watch,
            _gone: gone,
        };
        let expired = |h: Held| {
            tracing::debug!(
                file = h.name,
                "lease ran out without renewal; unlocking its file"
            );
            let_go_of(h);
        };
        let before = held_deadline::remember(
            &self.held,
            token,
            valid_until,
            entry,
            |h| h.valid_until,
            expired,
        );
        if let Some(old) = before {
            // Owner tokens are unique: never, but never leak a lock either.
            let_go_of(old);
        }
    }

    /// Gives the lease of `token` (just registered by [`hold`](Self::hold))
    /// one more locked file, checked at each renewal and closed with it.
    pub(super) fn attach(&self, token: &str, companion: File, name: String) {
        match lock(&self.held).get_mut(token) {
            Some(held) => held.companions.push((companion, name)),
            // Already let go (its ttl ran out): the companion goes too.
            None => lock_file::unlock(&companion),
        }
    }

    /// Releases the lease of `token`: `false` if this backend holds none.
    pub(super) fn let_go(&self, token: &str) -> bool {
        let held = lock(&self.held).remove(token);
        match held {
            Some(held) => {
                let_go_of(held);
                true
            }
            None => false,
        }
    }

    /// One lease's renewal: its file is still the one at the name (else it
    /// is lost, and let go), and the record's expiry moves.
    pub(super) fn renew_one(&self, lease: &Lease) -> Result<Renewal, LockError> {
        let sent = Instant::now();
        let mut map = lock(&self.held);
        let Some(held) = map.get_mut(&lease.token) else {
            return Ok(Renewal::Refused);
        };
        if held.valid_until <= sent {
            // Its ttl passed without a renewal (a process stopped, then
            // resumed): let go, as the reaper is about to, and as a server
            // would have.
            if let Some(held) = map.remove(&lease.token) {
                let_go_of(held);
            }
            return Ok(Renewal::Refused);
        }
        let current = self
            .directory_is_current()
            .and_then(|ok| match ok {
                true => lock_file::is_current(&self.dir, &held.name, &held.file),
                false => Ok(false),
            })
            .and_then(|ok| {
                let mut ok = ok;
                for (file, name) in &held.companions {
                    if !ok {
                        break;
                    }
                    ok = lock_file::is_current(&self.dir, name, file)?;
                }
                Ok(ok)
            });
        match current {
            Ok(true) => {}
            Ok(false) => {
                let name = held.name.clone();
                if let Some(held) = map.remove(&lease.token) {
                    let_go_of(held);
                }
                tracing::debug!(
                    file = name,
                    "the lock file was removed or replaced under its holder"
                );
                return Ok(Renewal::Deleted);
            }
            Err(e) => return Err(self.failed("cannot check the lock file", &held.name, e)),
        }
        held.valid_until = lease_deadline(sent, held.ttl);
        if let Some(record) = &mut held.record {
            record.expires_ms = lock_file::now_millis().saturating_add(millis(held.ttl));
            record
                .write(&held.file)
                .map_err(|e| self.failed("cannot write the lock file", &held.name, e))?;
        }
        Ok(Renewal::Renewed {
            valid_until: held.valid_until,
        })
    }
}

impl FileBackend {
    /// Whether the directory at the URL's path is still the one this
    /// backend opened (not removed, moved away or replaced): a new
    /// directory at the path is where other processes now lock.
    fn directory_is_current(&self) -> Result<bool, rustix::io::Errno> {
        let at_path = match rustix::fs::stat(&self.config.dir) {
            Ok(stat) => stat,
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(false),
            Err(e) => return Err(e),
        };
        #[allow(clippy::useless_conversion)]
        let same = (u64::from(at_path.st_dev), u64::from(at_path.st_ino));
        Ok(lock_file::identity(&self.dir)? == same)
    }

    /// Starts the backend's one watch on its directory (its removal or
    /// move rings the loss alarm), at the first lease.
    fn watch_directory(&self) {
        self.dir_watch.get_or_init(|| {
            super::watch::watch_for_loss(&self.dir, &self.alarm)
                .map_err(|e| tracing::debug!(error = %e, "cannot watch the lock directory; its loss is found by renewals"))
                .ok()
        });
    }
}

/// A duration in whole milliseconds, saturating.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
