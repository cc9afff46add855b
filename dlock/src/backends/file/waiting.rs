//! Taking a lock file: one attempt (`try_acquire`, and each try of a
//! waiter), and the wait between attempts, woken by inotify (`watch.rs`)
//! or the re-check every second, bounded by the deadline.
//!
//! Cancel safety: an attempt makes no `.await` between taking the lock and
//! registering the lease, and a waiter's state is one open file and one
//! watch, both let go when its future is dropped: nothing stays locked,
//! no thread stays blocked.

use std::fs::File;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::lock_file::{self, Record};
use super::{watch, FileBackend};
use crate::backend::holder::holder_of;
use crate::backend::{lease_deadline, AcquireRequest, Lease};
use crate::LockError;

/// The net under the inotify wake-ups: a waiter tries again at least this
/// often.
pub(super) const RECHECK: Duration = Duration::from_secs(1);

/// How many times one attempt opens the file again because it was replaced
/// between the open and the lock.
const REOPENS: usize = 8;

/// What one attempt found.
pub(super) enum Attempt {
    /// The lease, held.
    Taken(Lease),
    /// Another open file holds the lock; this one is ours to wait with.
    Busy(File),
}

/// Never notified: the wake-up of a waiter without a watch.
static NEVER: Notify = Notify::const_new();

impl FileBackend {
    /// One attempt at `req`'s lock, with `file` (a waiter's open lock file)
    /// or a new open of it.
    pub(super) fn attempt(
        &self,
        req: &AcquireRequest,
        file: Option<File>,
    ) -> Result<Attempt, LockError> {
        let name = self.lock_name(&req.key);
        let open = || {
            lock_file::open(&self.dir, &name, &self.trust)
                .map_err(|e| self.failed("cannot open the lock file", &name, e))
        };
        let current = |file: &File| {
            lock_file::is_current(&self.dir, &name, file)
                .map_err(|e| self.failed("cannot check the lock file", &name, e))
        };
        let mut file = match file {
            // A waiter's file may have been removed or replaced meanwhile.
            Some(file) if current(&file)? => file,
            _ => open()?,
        };
        for _ in 0..REOPENS {
            let sent = Instant::now();
            let taken = lock_file::try_lock(&file)
                .map_err(|e| self.failed("cannot lock the lock file", &name, e))?;
            if !taken {
                return Ok(Attempt::Busy(file));
            }
            // Locked: but a file removed or replaced since the open is
            // nobody's lock any more.
            if current(&file)? {
                return self.granted(req, file, name, sent).map(Attempt::Taken);
            }
            lock_file::unlock(&file);
            file = open()?;
        }
        Ok(Attempt::Busy(file))
    }

    /// Counts the fence and writes the record into the locked `file`, then
    /// registers the lease. On an error the lock is let go.
    fn granted(
        &self,
        req: &AcquireRequest,
        file: File,
        name: String,
        sent: Instant,
    ) -> Result<Lease, LockError> {
        let stem = self.stem(&req.key);
        let written = lock_file::next_fence(&self.dir, &stem, &self.trust)
            .map_err(|e| {
                self.failed(
                    "cannot write the fence counter",
                    &format!("{stem}{}", super::names::FENCE),
                    e,
                )
            })
            .and_then(|fence| {
                let record = Record {
                    key: req.key.clone(),
                    holder: holder_of(&req.token).unwrap_or_default().to_owned(),
                    pid: std::process::id(),
                    fence,
                    expires_ms: lock_file::now_millis()
                        .saturating_add(super::held::millis(req.ttl)),
                };
                record
                    .write(&file)
                    .map(|()| record)
                    .map_err(|e| self.failed("cannot write the lock file", &name, e))
            });
        let record = match written {
            Ok(record) => record,
            Err(e) => {
                lock_file::unlock(&file);
                return Err(e);
            }
        };
        let valid_until = lease_deadline(sent, req.ttl);
        let lease = Lease {
            key: req.key.clone(),
            token: req.token.clone(),
            ttl: req.ttl,
            fencing_token: Some(record.fence),
            valid_until,
            resource: self.config.dir.join(&name).display().to_string(),
        };
        self.hold(&req.token, file, name, Some(record), req.ttl, valid_until);
        Ok(lease)
    }

    /// `acquire`: attempts, and between them a wait for the lock file's
    /// events, the re-check or the deadline.
    pub(super) async fn wait_for(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let mut file = match self.attempt(req, None)? {
            Attempt::Taken(lease) => return Ok(Some(lease)),
            Attempt::Busy(file) => file,
        };
        let name = self.lock_name(&req.key);
        let path = self.config.dir.join(&name);
        let identity = |file: &File| {
            lock_file::identity(file)
                .map_err(|e| self.failed("cannot check the lock file", &name, e))
        };
        let mut watch = None;
        let mut watched = None;
        loop {
            // The watch follows the file this waiter has open.
            let id = identity(&file)?;
            if watched != Some(id) {
                // (The old watch goes after the new one is added, so a
                // shared descriptor is never removed in between.)
                watch = watch::watch(&path).ok();
                watched = Some(id);
            }
            let notify = watch.as_ref().map_or(&NEVER, watch::Watch::notify);
            let woken = notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Tried after the watch is armed: a release from here on wakes it.
            file = match self.attempt(req, Some(file))? {
                Attempt::Taken(lease) => return Ok(Some(lease)),
                Attempt::Busy(file) => file,
            };
            if identity(&file)? != id {
                // Opened anew (the old file was replaced): watch the new one first.
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Ok(None);
            }
            let nap = deadline.map_or(now + RECHECK, |d| d.min(now + RECHECK));
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep_until(nap.into()) => {}
            }
        }
    }
}
