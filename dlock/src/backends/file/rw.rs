//! Read-write locks (`RwBackend`): the file `<prefix>~rw~<key>.lock`,
//! taken with `flock(LOCK_SH)` by readers and `flock(LOCK_EX)` by
//! writers, and a gate file beside it, `<prefix>~rw~<key>.gate`, for the
//! contract's order: a waiting writer holds the gate exclusively until it
//! is granted, and a reader passes the gate (shared, for an instant)
//! before it takes the lock, so readers that come after a waiting writer
//! stay out and writers never starve. Writers queue for the gate as for a
//! plain lock; the kernel's `flock` promises no order of its own.
//!
//! Write fences come from `<prefix>~rw~<key>.fence` (as a plain lock's);
//! a read's fence is that counter read while holding the lock shared (the
//! last write's fence: no write can run meanwhile, and the next write's is
//! greater). The lock file holds no record (readers share it): `inspect`
//! and `list` see plain locks only.
//!
//! `flock -s <file> cmd` takes part as a reader and `flock <file> cmd` as a
//! writer (without the gate: a `flock(1)` writer does not keep new readers
//! out while it waits).
//!
//! Every holder and waiter keeps its files only in its own state, and the
//! gate is closed (not only unlocked) when let go, since a close is what
//! wakes the waiters: a dropped writer's gate goes with its future.

use std::fs::File;
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::lock_file;
use super::waiting::RECHECK;
use super::{names, watch, FileBackend};
use crate::backend::{lease_deadline, Lease, Renewal, RwBackend, RwMode, RwRequest};
use crate::LockError;

/// Never notified: the wake-up of a waiter without a watch.
static NEVER: Notify = Notify::const_new();

/// The files of one read-write lock.
struct RwFiles {
    stem: String,
    lock: String,
    gate: String,
}

/// A waiter's open files between attempts. A failed attempt closes
/// nothing (a close is an event that wakes every waiter of the file: a
/// waiter closing on each failed try would wake the others for ever); the
/// gate is closed when the waiter is granted, gives up or fails, which
/// wakes the writers waiting for it.
#[derive(Default)]
struct Waiting {
    gate: Option<File>,
    /// A writer holds `gate` exclusively.
    gate_held: bool,
    lock: Option<File>,
}

impl FileBackend {
    fn rw_files(&self, key: &str) -> RwFiles {
        let stem = names::rw_stem(&self.config.prefix, key);
        RwFiles {
            lock: format!("{stem}{}", names::LOCK),
            gate: format!("{stem}.gate"),
            stem,
        }
    }

    /// The lock file of the read-write lock `key`: what `flock -s` (a
    /// reader) or `flock` (a writer) takes.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let files = dlock::backends::file::FileBackend::connect("file:///var/lock/myapp").await?;
    /// assert_eq!(files.rw_lock_path("cache"), std::path::Path::new("/var/lock/myapp/dlock~rw~cache.lock"));
    /// # Ok(()) }
    /// ```
    pub fn rw_lock_path(&self, key: &str) -> std::path::PathBuf {
        self.config.dir.join(self.rw_files(key).lock)
    }

    fn open_file(&self, name: &str) -> Result<File, LockError> {
        lock_file::open(&self.dir, name, &self.trust)
            .map_err(|e| self.failed("cannot open the lock file", name, e))
    }

    /// One attempt; `state` keeps the waiter's files between attempts.
    fn rw_attempt(
        &self,
        req: &RwRequest,
        files: &RwFiles,
        state: &mut Waiting,
    ) -> Result<Option<Lease>, LockError> {
        let fail = |e| self.failed("cannot lock the gate file", &files.gate, e);
        let gate = match state.gate.take() {
            Some(gate) => gate,
            None => self.open_file(&files.gate)?,
        };
        let passed = match req.mode {
            RwMode::Write if state.gate_held => true,
            RwMode::Write => lock_file::try_lock(&gate).map_err(fail)?,
            // A reader holds the gate shared only through its attempt.
            RwMode::Read => lock_file::try_lock_shared(&gate).map_err(fail)?,
        };
        state.gate_held = passed && req.mode == RwMode::Write;
        if !passed {
            state.gate = Some(gate);
            return Ok(None);
        }
        let taken = self.rw_take(req, files, &mut state.lock);
        match (&taken, req.mode) {
            // Still waiting: a writer keeps the gate; a reader lets it go
            // without a close (no event: the others need not wake).
            (Ok(None), RwMode::Write) => state.gate = Some(gate),
            (Ok(None), RwMode::Read) => {
                lock_file::unlock(&gate);
                state.gate = Some(gate);
            }
            // Granted or failed: the gate is closed, waking the writers
            // waiting for it.
            _ => {
                lock_file::unlock(&gate);
                state.gate_held = false;
            }
        }
        taken
    }

    /// Takes the lock file itself in `req`'s mode, once past the gate,
    /// with the waiter's open file `kept` (or a new open of it).
    fn rw_take(
        &self,
        req: &RwRequest,
        files: &RwFiles,
        kept: &mut Option<File>,
    ) -> Result<Option<Lease>, LockError> {
        let fail = |e| self.failed("cannot lock the lock file", &files.lock, e);
        for _ in 0..8 {
            let file = match kept.take() {
                Some(file)
                    if lock_file::is_current(&self.dir, &files.lock, &file).map_err(fail)? =>
                {
                    file
                }
                _ => self.open_file(&files.lock)?,
            };
            let sent = Instant::now();
            let taken = match req.mode {
                RwMode::Write => lock_file::try_lock(&file),
                RwMode::Read => lock_file::try_lock_shared(&file),
            }
            .map_err(fail)?;
            if !taken {
                *kept = Some(file);
                return Ok(None);
            }
            if !lock_file::is_current(&self.dir, &files.lock, &file).map_err(fail)? {
                lock_file::unlock(&file);
                continue;
            }
            let fenced = match req.mode {
                RwMode::Write => lock_file::next_fence(&self.dir, &files.stem, &self.trust),
                RwMode::Read => lock_file::last_fence(&self.dir, &files.stem, &self.trust),
            };
            let fence = match fenced {
                Ok(fence) => fence,
                Err(e) => {
                    lock_file::unlock(&file);
                    let counter = format!("{}{}", files.stem, names::FENCE);
                    return Err(self.failed("cannot use the fence counter", &counter, e));
                }
            };
            let valid_until = lease_deadline(sent, req.ttl);
            let lease = Lease {
                key: req.key.clone(),
                token: req.token.clone(),
                ttl: req.ttl,
                fencing_token: Some(fence),
                valid_until,
                resource: self.config.dir.join(&files.lock).display().to_string(),
            };
            self.hold(
                &req.token,
                file,
                files.lock.clone(),
                None,
                req.ttl,
                valid_until,
            );
            return Ok(Some(lease));
        }
        Ok(None)
    }
}

#[async_trait]
impl RwBackend for FileBackend {
    async fn try_acquire_rw(&self, req: &RwRequest) -> Result<Option<Lease>, LockError> {
        self.rw_attempt(req, &self.rw_files(&req.key), &mut Waiting::default())
    }

    async fn acquire_rw(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let files = self.rw_files(&req.key);
        let mut state = Waiting::default();
        if let Some(lease) = self.rw_attempt(req, &files, &mut state)? {
            return Ok(Some(lease));
        }
        // Both files are watched: the gate (a writer ahead let go) and the
        // lock (its holders let go). Made sure to exist by the attempt.
        let gate_watch = watch::watch(&self.config.dir.join(&files.gate)).ok();
        let lock_watch = watch::watch(&self.config.dir.join(&files.lock)).ok();
        loop {
            let gate_woken = gate_watch
                .as_ref()
                .map_or(&NEVER, watch::Watch::notify)
                .notified();
            let lock_woken = lock_watch
                .as_ref()
                .map_or(&NEVER, watch::Watch::notify)
                .notified();
            tokio::pin!(gate_woken, lock_woken);
            gate_woken.as_mut().enable();
            lock_woken.as_mut().enable();
            if let Some(lease) = self.rw_attempt(req, &files, &mut state)? {
                return Ok(Some(lease));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Ok(None);
            }
            let nap = deadline.map_or(now + RECHECK, |d| d.min(now + RECHECK));
            tokio::select! {
                () = &mut gate_woken => {}
                () = &mut lock_woken => {}
                () = tokio::time::sleep_until(nap.into()) => {}
            }
        }
    }

    async fn renew_rw(&self, _mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        leases.iter().map(|lease| self.renew_one(lease)).collect()
    }

    async fn release_rw(&self, _mode: RwMode, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.let_go(&lease.token))
    }
}
