//! Double barriers (`BarrierBackend`), in the shape of Curator's
//! `DistributedDoubleBarrier`: the barrier `name` is the member files
//! `<prefix>~barrier~<name>~<16 hex digits>.member` and, while it is open,
//! the file `<prefix>~barrier~<name>~ready`.
//!
//! - A member is a lease like a permit: its file is created under a
//!   temporary name, locked with `flock(LOCK_EX)`, given the holder's
//!   record (with its expiry) and only then renamed into place
//!   (`RENAME_NOREPLACE`), so a member file at its name is always locked by
//!   its member. The kernel frees the lock when the member's process dies;
//!   the watchdog renews the record's expiry (`held.rs`, as for locks), and
//!   the reaper lets the file go when its ttl passes without a renewal.
//! - The census: a member counts while its file is locked and its record's
//!   expiry (wall clock) is ahead. A member file nobody locks is a member
//!   gone without removing its file (a killed process): whoever finds it
//!   removes it. A stopped process keeps its lock, but its expiry passes:
//!   it is counted out within its ttl either way.
//! - `enter`: with `ready` there, the barrier is open and the member passes
//!   at once; else, with `parties` members counted, it creates `ready`
//!   (`O_EXCL`, the backend's mode), which opens the barrier for everyone.
//!   A `ready` found with no member but the caller's is a dead round's (its
//!   members killed before they left): the caller removes it and starts a
//!   new round, as etcd's lone member does.
//!   The member renews its own record while it waits. A timed-out or
//!   dropped `enter` removes its file (a guard, synchronously).
//! - `leave` (`wait_all_left`, once the caller's member is removed): waits
//!   until no member counts, then removes `ready`, closing the barrier for
//!   the next round. The member's lease names the `ready` file (device and
//!   inode) of its round: a `ready` gone or replaced means another member
//!   saw the round empty already.
//! - Waiting is woken by inotify on the directory (`watch.rs`: a member or
//!   `ready` created, renamed in or removed), one watch shared by every
//!   waiter of the process, armed before each look; and, for a member that
//!   stopped renewing, at the earliest expiry among the members counted.
//!   Only if inotify refuses does a waiter re-check every second.
//!
//! Every file found is checked as the backend's others are (`trust.rs`).
//! No `fsync`, as elsewhere in this backend: membership does not outlive
//! its processes.

use std::fs::File;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::lock_file::{self, Identity, Record};
use super::waiting::RECHECK;
use super::{held, names, trust, watch, FileBackend};
use crate::backend::holder::holder_of;
use crate::backend::LockBackend as _;
use crate::backend::{lease_deadline, BarrierBackend, BarrierRequest, Lease, Renewal};
use crate::LockError;

/// The ending of a member's file.
const MEMBER: &str = ".member";

/// The ending of the file whose presence opens the barrier (Curator's
/// `ready` node).
const READY: &str = "~ready";

/// The file names of one barrier.
struct BarrierFiles {
    /// `<prefix>~barrier~<name>`.
    stem: String,
    ready: String,
}

impl BarrierFiles {
    fn new(prefix: &str, name: &str) -> Self {
        let stem = names::barrier_stem(prefix, name);
        BarrierFiles {
            ready: format!("{stem}{READY}"),
            stem,
        }
    }

    /// A new member's name.
    fn new_member(&self) -> String {
        format!("{}~{}{MEMBER}", self.stem, trust::random_suffix())
    }

    /// Whether `file` is one of this barrier's member files.
    fn is_member(&self, file: &str) -> bool {
        file.strip_prefix(self.stem.as_str())
            .and_then(|rest| rest.strip_prefix('~'))
            .and_then(|rest| rest.strip_suffix(MEMBER))
            .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

/// What a census of the members found.
struct Census {
    /// Members whose file is locked and whose expiry is ahead.
    live: usize,
    /// The earliest expiry among them (wall clock, ms): when a member that
    /// stopped renewing is counted out.
    next_expiry: Option<u64>,
}

/// The member lease's resource: the member's file, and the `ready` file of
/// its round (device and inode).
fn resource(path: &str, round: Identity) -> String {
    format!("{path}#{}:{}", round.0, round.1)
}

fn round_of(resource: &str) -> Option<Identity> {
    let (_, round) = resource.rsplit_once('#')?;
    let (dev, ino) = round.split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// The instant of the wall-clock time `ms` (a moment after it).
fn instant_of(ms: u64) -> Instant {
    let ahead = ms.saturating_sub(lock_file::now_millis()).saturating_add(1);
    crate::backend::deadline::saturating_add(Instant::now(), Duration::from_millis(ahead))
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// Removes the member of an `enter` that ended without handing it over
/// (timed out, failed, dropped), so it never counts towards `parties`.
struct Entering<'a> {
    backend: &'a FileBackend,
    token: &'a str,
    armed: bool,
}

impl Drop for Entering<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.backend.remove_member_file(self.token);
        }
    }
}

impl FileBackend {
    /// Creates, locks and places a member file for `req`, held as the lease
    /// of `req.token`: the member's file name and the lease's end.
    fn add_member(
        &self,
        req: &BarrierRequest,
        files: &BarrierFiles,
    ) -> Result<(String, Instant), LockError> {
        let name = files.new_member();
        let fail = |e: Errno| self.failed("cannot add the barrier member", &name, e);
        let record = Record {
            key: req.name.clone(),
            holder: holder_of(&req.token).unwrap_or_default().to_owned(),
            pid: std::process::id(),
            fence: 0,
            expires_ms: lock_file::now_millis().saturating_add(held::millis(req.ttl)),
        };
        let sent = Instant::now();
        let (file, temporary) =
            lock_file::create_temporary(&self.dir, &name, &self.trust).map_err(fail)?;
        let placed = lock_file::try_lock(&file)
            .and_then(|locked| if locked { Ok(()) } else { Err(Errno::AGAIN) })
            .and_then(|()| record.write(&file))
            .and_then(|()| self.place_new(&temporary, &name));
        // After a rename nothing is left at the temporary name; after a
        // link or a failure, the temporary file goes.
        let _ = rustix::fs::unlinkat(&self.dir, &temporary, AtFlags::empty());
        match placed.map_err(fail)? {
            true => {}
            // 64 random bits taken already: refuse rather than share.
            false => return Err(fail(Errno::EXIST)),
        }
        let valid_until = lease_deadline(sent, req.ttl);
        self.hold(
            &req.token,
            file,
            name.clone(),
            Some(record),
            req.ttl,
            valid_until,
        );
        Ok((name, valid_until))
    }

    /// Removes the member file held for `token` and lets it go: `false` if
    /// this backend holds none (its ttl ran out: counted out already).
    fn remove_member_file(&self, token: &str) -> bool {
        let Some(member) = held::lock(&self.held).remove(token) else {
            return false;
        };
        // Only the file still at its name (an operator may have replaced it).
        if matches!(
            lock_file::is_current(&self.dir, &member.name, &member.file),
            Ok(true)
        ) {
            let _ = rustix::fs::unlinkat(&self.dir, &member.name, AtFlags::empty());
        }
        lock_file::unlock(&member.file);
        true
    }

    /// Counts the live members of the barrier, removing the files of
    /// members that are gone.
    fn census(&self, files: &BarrierFiles) -> Result<Census, LockError> {
        let fail = |name: &str, e: lock_file::FileError| {
            self.failed("cannot count the barrier's members", name, e)
        };
        let entries = std::fs::read_dir(&self.config.dir)
            .map_err(|e| fail(&files.stem, io_errno(&e).into()))?;
        let now = lock_file::now_millis();
        let mut census = Census {
            live: 0,
            next_expiry: None,
        };
        for entry in entries {
            let entry = entry.map_err(|e| fail(&files.stem, io_errno(&e).into()))?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().filter(|n| files.is_member(n)) else {
                continue;
            };
            let Some(file) = lock_file::open_existing(&self.dir, name, &self.trust)
                .map_err(|e| fail(name, e))?
            else {
                continue;
            };
            if lock_file::try_lock_shared(&file).map_err(|e| fail(name, e.into()))? {
                // Nobody locks it: its member is gone (a member's file is
                // locked before it is placed, and never again after).
                self.remove_stale(name, &file);
                continue;
            }
            let record = lock_file::read_file(&file)
                .ok()
                .and_then(|text| Record::parse(&text));
            // No record: a member letting go (its record cleared, its lock
            // about to go). An expiry passed: a member that stopped renewing.
            if let Some(record) = record.filter(|r| r.expires_ms > now) {
                census.live += 1;
                census.next_expiry = Some(
                    census
                        .next_expiry
                        .map_or(record.expires_ms, |e| e.min(record.expires_ms)),
                );
            }
        }
        Ok(census)
    }

    /// Removes the unlocked member file `name` (open as `file`, shared
    /// lock taken), if it is still the one at the name.
    fn remove_stale(&self, name: &str, file: &File) {
        if matches!(lock_file::is_current(&self.dir, name, file), Ok(true)) {
            tracing::debug!(
                file = name,
                "removing the file of a barrier member that is gone"
            );
            let _ = rustix::fs::unlinkat(&self.dir, name, AtFlags::empty());
        }
    }

    /// The `ready` file's identity, if the barrier is open.
    fn ready_round(&self, files: &BarrierFiles) -> Result<Option<Identity>, LockError> {
        let fail = |e: lock_file::FileError| {
            self.failed("cannot check the barrier's ready file", &files.ready, e)
        };
        let Some(file) =
            lock_file::open_existing(&self.dir, &files.ready, &self.trust).map_err(fail)?
        else {
            return Ok(None);
        };
        lock_file::identity(&file)
            .map(Some)
            .map_err(|e| fail(e.into()))
    }

    /// Creates the `ready` file (if no one did first): the barrier opens.
    fn open_barrier(&self, files: &BarrierFiles) -> Result<(), LockError> {
        let fail = |e: Errno| self.failed("cannot open the barrier", &files.ready, e);
        let create =
            OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::CREATE | OFlags::EXCL;
        let mode = Mode::from_raw_mode(self.trust.mode);
        match rustix::fs::openat(&self.dir, &files.ready, create, mode) {
            // Exactly the mode (the umask does not narrow a group's 0660).
            Ok(fd) => rustix::fs::fchmod(&fd, mode).map_err(fail),
            Err(Errno::EXIST) => Ok(()),
            Err(e) => Err(fail(e)),
        }
    }

    /// Removes the `ready` file of `round`, if it is still that one.
    fn close_round(&self, files: &BarrierFiles, round: Identity) -> Result<(), LockError> {
        let fail = |e: Errno| self.failed("cannot close the barrier", &files.ready, e);
        if lock_file::identity_at(&self.dir, &files.ready).map_err(fail)? != Some(round) {
            return Ok(());
        }
        match rustix::fs::unlinkat(&self.dir, &files.ready, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(fail(e)),
        }
    }

    /// The member's renewal while it waits in `enter` (the watchdog takes
    /// over once it returns): its new end, or an error if it was lost.
    fn renew_entering(&self, lease: &Lease) -> Result<Instant, LockError> {
        match self.renew_one(lease)? {
            Renewal::Renewed { valid_until } => Ok(valid_until),
            _ => Err(LockError::backend(
                self.describe(),
                format!(
                    "barrier member `{}` vanished while it waited (its file removed or replaced, or its ttl passed)",
                    lease.resource
                ),
            )),
        }
    }

    async fn enter_member(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let files = BarrierFiles::new(&self.config.prefix, &req.name);
        let mut entries = watch::EntriesWaiter::new(&self.config.dir);
        let (member, valid_until) = self.add_member(req, &files)?;
        let mut entering = Entering {
            backend: self,
            token: &req.token,
            armed: true,
        };
        let path = self.config.dir.join(&member).display().to_string();
        let mut lease = Lease::unfenced(&req.name, &req.token, req.ttl, valid_until, path.clone());
        let refresh = req.ttl / 3;
        let mut refresh_at = crate::backend::deadline::saturating_add(Instant::now(), refresh);
        loop {
            entries.refresh(&self.config.dir);
            let woken = entries.notify().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Looked at after the watch is armed: a change from here on wakes it.
            let mut round = self.ready_round(&files)?;
            let census = self.census(&files)?;
            if let Some(stale) = round.filter(|_| census.live <= 1) {
                // `ready` with no member but ours: left by a round whose
                // members all died (or all left and have not closed it yet,
                // which they take as closed): this is a new round.
                self.close_round(&files, stale)?;
                round = None;
            }
            if round.is_none() && census.live >= req.parties {
                self.open_barrier(&files)?;
                // (Closed again at once only if every member left.)
                round = self.ready_round(&files)?;
            }
            let next_expiry = census.next_expiry;
            if let Some(round) = round {
                // Still our member (not counted out while we looked).
                lease.valid_until = self.renew_entering(&lease)?;
                lease.resource = resource(&path, round);
                entering.armed = false;
                return Ok(Some(lease));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                // Dropping `entering` removes the member.
                return Ok(None);
            }
            if refresh_at <= now {
                lease.valid_until = self.renew_entering(&lease)?;
                refresh_at = crate::backend::deadline::saturating_add(now, refresh);
            }
            let mut wake = refresh_at;
            if let Some(expiry) = next_expiry {
                wake = wake.min(instant_of(expiry));
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            if !entries.watching() {
                wake = wake.min(now + RECHECK);
            }
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    async fn wait_members_gone(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        let files = BarrierFiles::new(&self.config.prefix, &member.key);
        let Some(round) = round_of(&member.resource) else {
            return Err(LockError::backend(
                self.describe(),
                format!(
                    "`{}` is not a barrier member of this backend",
                    member.resource
                ),
            ));
        };
        let mut entries = watch::EntriesWaiter::new(&self.config.dir);
        loop {
            entries.refresh(&self.config.dir);
            let woken = entries.notify().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // `ready` gone or replaced: a member saw this round empty.
            if self.ready_round(&files)? != Some(round) {
                return Ok(true);
            }
            let census = self.census(&files)?;
            if census.live == 0 {
                self.close_round(&files, round)?;
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Ok(false);
            }
            let mut wake = census.next_expiry.map(instant_of);
            if let Some(d) = deadline {
                wake = Some(wake.map_or(d, |w| w.min(d)));
            }
            if !entries.watching() {
                wake = Some(wake.map_or(now + RECHECK, |w| w.min(now + RECHECK)));
            }
            match wake {
                Some(wake) => {
                    tokio::select! {
                        () = &mut woken => {}
                        () = tokio::time::sleep_until(wake.into()) => {}
                    }
                }
                None => woken.await,
            }
        }
    }
}

#[async_trait]
impl BarrierBackend for FileBackend {
    async fn enter_barrier(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.enter_member(req, deadline).await
    }

    async fn wait_all_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        self.wait_members_gone(member, deadline).await
    }

    async fn renew_members(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        leases.iter().map(|lease| self.renew_one(lease)).collect()
    }

    async fn remove_member(&self, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.remove_member_file(&lease.token))
    }
}

#[cfg(test)]
mod tests {
    use super::{resource, round_of, BarrierFiles};

    #[test]
    fn member_files_are_told_from_ready_and_other_barriers() {
        let files = BarrierFiles::new("dlock", "b");
        assert!(files.is_member(&files.new_member()));
        assert!(!files.is_member(&files.ready));
        assert!(!files.is_member("dlock~barrier~b~0123abcd.member.0123456789abcdef.tmp"));
        assert!(!BarrierFiles::new("dlock", "b2").is_member(&files.new_member()));
    }

    #[test]
    fn the_round_is_read_back_from_the_resource() {
        let r = resource("/d/dlock~barrier~b~00.member", (3, 42));
        assert_eq!(round_of(&r), Some((3, 42)));
        assert_eq!(round_of("/d/x"), None);
    }
}
