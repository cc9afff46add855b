//! Semaphores (`PermitBackend`): a semaphore `name` of N permits is N slot
//! files, `<prefix>~sem~<name>~0.lock` … `~<N-1>.lock`, and a count file,
//! `<prefix>~sem~<name>~count`.
//!
//! - A permit is an exclusive `flock(LOCK_EX|LOCK_NB)` on the first free
//!   slot file: the kernel frees a dead holder's slot when it closes the
//!   process's files, whatever the ttl.
//! - The count is kept honestly: the count file holds the number (a
//!   decimal line), and every holder keeps `flock(LOCK_SH)` on it while it
//!   holds its permit. The number is written only under `LOCK_EX`, which
//!   the kernel grants only when no holder keeps its shared lock: so the
//!   count may change once every permit is back, and a caller with
//!   another count while a permit is out is refused
//!   ([`permit_count_differs`]). A caller takes its slot first, then the
//!   shared lock, then reads the number again (a writer may have come
//!   between its first read and the shared lock: Linux converts and takes
//!   `flock`s in two steps); another number lets both go.
//! - Waiting (first in line): the waiter keeps every slot file and the
//!   count file open and watched (inotify, `watch.rs`); a holder's release, its process's
//!   death, or a count writer closing the count file wakes it; the
//!   re-check every second is the net, as for locks. A failed attempt
//!   closes nothing (a close would wake the other waiters, whose failed
//!   attempts would wake it again); a dropped `acquire_permit` closes its
//!   files and holds nothing, since an attempt makes no `.await` between
//!   taking a slot and registering the permit.
//! - Several permits at once (`PermitRequest::count` = n): one attempt
//!   locks n free slots, or none (finding fewer free, it unlocks what it
//!   took without a close). The first slot is the lease's file, the
//!   others and the count file are its companions (`held.rs`): renewed,
//!   released and expired together.
//! - Arrival order: `flock` grants none, so waiters stand in line with
//!   ticket files (`line.rs`) and only the first live ticket takes slots;
//!   a `try_acquire`, or a new `acquire`, that finds a live ticket takes
//!   nothing and (waiting) stands behind. The first in line watches the
//!   slot files and the count file; the others watch the ticket in front.
//!   A dropped wait removes its ticket (its `Drop`).
//! - A permit's renewal checks that its slot files and the count file are
//!   still the ones at their names (an operator removing one is a lost
//!   permit, as for locks); its reaper lets it go when its ttl passes
//!   without renewal. Permits have no fencing token.
//!
//! A caller that holds a slot for the instant between taking it and
//! reading the count also keeps the shared lock: a caller with another
//! count in that instant is refused although no permit may come of it (it
//! can try again). At most [`MAX_PERMITS`] permits per semaphore: a waiter
//! holds one open file and one inotify watch per slot.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::pin::Pin;
use std::time::Instant;

use async_trait::async_trait;
use rustix::io::Errno;

use super::line::Ahead;
use super::lock_file;
use super::waiting::RECHECK;
use super::{inspect, names, watch, FileBackend};
use crate::backend::{
    lease_deadline, permit_count_differs, Lease, PermitBackend, PermitRequest, Renewal,
};
use crate::LockError;

/// The most permits a semaphore of this backend has: each is a file, and
/// a waiter keeps every one of them open and watched.
pub(super) const MAX_PERMITS: usize = 1024;

/// How many times one attempt starts over because a count writer came
/// between its steps.
const ROUNDS: usize = 8;

/// The files of one semaphore.
pub(super) struct SemFiles {
    stem: String,
    pub(super) count: String,
}

impl SemFiles {
    pub(super) fn slot(&self, i: usize) -> String {
        format!("{}~{i}{}", self.stem, names::LOCK)
    }
}

/// A slot an attempt locked: its number, file and name.
type Taken = (usize, File, String);

/// A caller's open files between attempts (kept so that a failed attempt
/// closes nothing).
#[derive(Default)]
struct Kept {
    count: Option<File>,
    slots: Vec<Option<File>>,
}

/// The number in a count file: `None` for an empty file or anything else.
fn parse_count(text: &str) -> Option<usize> {
    text.lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .filter(|n| *n > 0)
}

fn read_count(file: &File) -> Result<Option<usize>, Errno> {
    lock_file::read_file(file).map(|text| parse_count(&text))
}

fn write_count(file: &File, count: usize) -> Result<(), Errno> {
    let line = format!("{count}\n");
    file.write_all_at(line.as_bytes(), 0)
        .and_then(|()| file.set_len(line.len() as u64))
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
}

/// What setting the count found.
enum Recount {
    /// The count file holds the caller's count now (or did an instant ago):
    /// try again.
    Again,
    /// Holders keep the count file shared with this count.
    Stored(usize),
}

impl FileBackend {
    /// Whether the file `name` is held by an exclusive `flock`: looked up
    /// in `holders` (`/proc/locks`), which disturbs nobody, or without it
    /// probed with a shared lock. A missing file is free.
    pub(super) fn slot_held(
        &self,
        name: &str,
        holders: Option<&std::collections::HashMap<lock_file::Identity, u32>>,
    ) -> Result<bool, LockError> {
        let fail = |e: lock_file::FileError| self.failed("cannot read the semaphore file", name, e);
        if let Some(holders) = holders {
            let id = lock_file::identity_at(&self.dir, name).map_err(|e| fail(e.into()))?;
            return Ok(id.is_some_and(|id| holders.contains_key(&id)));
        }
        match lock_file::open_existing(&self.dir, name, &self.trust).map_err(fail)? {
            Some(file) => inspect::probed_held(&file).map_err(|e| fail(e.into())),
            None => Ok(false),
        }
    }

    /// `available`: the slots of `name` below `permits` held now, and a
    /// stored count other than `permits` refused while a slot below it is held.
    fn free_permits(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        if permits > MAX_PERMITS {
            return Err(LockError::invalid_option(format!(
                "semaphore `{name}` has {permits} permits; the file backend's semaphores have at most {MAX_PERMITS} (one file each): use fewer"
            )));
        }
        let files = self.sem_files(name);
        let holders = inspect::flock_holders();
        let stored = self.stored_count(&files)?;
        let mut held = 0;
        for i in 0..permits {
            if self.slot_held(&files.slot(i), holders.as_ref())? {
                held += 1;
            }
        }
        if let Some(stored) = stored.filter(|s| *s != permits) {
            for i in 0..stored.min(MAX_PERMITS) {
                if self.slot_held(&files.slot(i), holders.as_ref())? {
                    return Err(permit_count_differs(name, stored, permits));
                }
            }
        }
        Ok(permits.saturating_sub(held))
    }

    /// The number in the semaphore's count file (`None` without the file
    /// or a number), read without a lock.
    pub(super) fn stored_count(&self, files: &SemFiles) -> Result<Option<usize>, LockError> {
        let fail = |e: lock_file::FileError| {
            self.failed("cannot read the semaphore's count", &files.count, e)
        };
        match lock_file::open_existing(&self.dir, &files.count, &self.trust).map_err(fail)? {
            Some(file) => read_count(&file).map_err(|e| fail(e.into())),
            None => Ok(None),
        }
    }

    pub(super) fn sem_files(&self, name: &str) -> SemFiles {
        let stem = names::sem_stem(&self.config.prefix, name);
        SemFiles {
            count: format!("{stem}~count"),
            stem,
        }
    }

    /// `kept`, if still the file at `name`, else a new open of it.
    fn reopened(&self, name: &str, kept: Option<File>) -> Result<File, LockError> {
        if let Some(file) = kept {
            let current = lock_file::is_current(&self.dir, name, &file)
                .map_err(|e| self.failed("cannot check the semaphore file", name, e))?;
            if current {
                return Ok(file);
            }
        }
        lock_file::open(&self.dir, name, &self.trust)
            .map_err(|e| self.failed("cannot open the semaphore file", name, e))
    }

    /// Writes `req.permits` into the count file if no holder keeps it.
    fn recount(
        &self,
        req: &PermitRequest,
        files: &SemFiles,
        count: &File,
    ) -> Result<Recount, LockError> {
        let fail = |e| self.failed("cannot set the semaphore's count", &files.count, e);
        if lock_file::try_lock(count).map_err(fail)? {
            // No holder: the count is the caller's to set.
            let written = match lock_file::is_current(&self.dir, &files.count, count) {
                Ok(true) => write_count(count, req.permits),
                Ok(false) => Ok(()),
                Err(e) => Err(e),
            };
            lock_file::unlock(count);
            written.map_err(fail)?;
            return Ok(Recount::Again);
        }
        // Held shared (a permit is out) or by another writer.
        Ok(match read_count(count).map_err(fail)? {
            Some(stored) if stored != req.permits => Recount::Stored(stored),
            _ => Recount::Again,
        })
    }

    /// One attempt at a permit, with the caller's open files `kept`.
    fn permit_attempt(
        &self,
        req: &PermitRequest,
        files: &SemFiles,
        kept: &mut Kept,
    ) -> Result<Option<Lease>, LockError> {
        if req.permits > MAX_PERMITS {
            return Err(LockError::invalid_option(format!(
                "semaphore `{}` has {} permits; the file backend's semaphores have at most {MAX_PERMITS} (one file each): use fewer",
                req.name, req.permits
            )));
        }
        kept.slots.resize_with(req.permits, || None);
        let fail = |name: &str, e| self.failed("cannot lock the semaphore file", name, e);
        'rounds: for _ in 0..ROUNDS {
            let count = self.reopened(&files.count, kept.count.take())?;
            let stored = read_count(&count).map_err(|e| fail(&files.count, e))?;
            if stored != Some(req.permits) {
                let recount = self.recount(req, files, &count);
                kept.count = Some(count);
                match recount? {
                    Recount::Again => continue 'rounds,
                    Recount::Stored(stored) => {
                        return Err(permit_count_differs(&req.name, stored, req.permits))
                    }
                }
            }
            kept.count = Some(count);
            let sent = Instant::now();
            let Some(taken) = self.take_slots(req, files, kept)? else {
                return Ok(None);
            };
            match self.confirm_count(req, files, kept)? {
                Some(count) => return Ok(self.grant(req, taken, count, sent)),
                None => {
                    give_back(taken, kept);
                    continue 'rounds;
                }
            }
        }
        Ok(None)
    }

    /// `req.count` free slots, locked; `None` (nothing locked) if fewer
    /// are free.
    fn take_slots(
        &self,
        req: &PermitRequest,
        files: &SemFiles,
        kept: &mut Kept,
    ) -> Result<Option<Vec<Taken>>, LockError> {
        let fail = |name: &str, e| self.failed("cannot lock the semaphore file", name, e);
        let mut taken = Vec::with_capacity(req.count);
        for i in 0..req.permits {
            let name = files.slot(i);
            let slot = match self.reopened(&name, kept.slots[i].take()) {
                Ok(slot) => slot,
                Err(e) => {
                    give_back(taken, kept);
                    return Err(e);
                }
            };
            let locked = lock_file::try_lock(&slot)
                .and_then(|locked| match locked {
                    true => lock_file::is_current(&self.dir, &name, &slot).map(|current| {
                        if !current {
                            // Replaced since the open: the next attempt opens the new one.
                            lock_file::unlock(&slot);
                        }
                        Some(current)
                    }),
                    false => Ok(None),
                })
                .map_err(|e| fail(&name, e));
            match locked {
                Ok(Some(true)) => taken.push((i, slot, name)),
                Ok(Some(false)) => {}
                Ok(None) => kept.slots[i] = Some(slot),
                Err(e) => {
                    kept.slots[i] = Some(slot);
                    give_back(taken, kept);
                    return Err(e);
                }
            }
            if taken.len() == req.count {
                return Ok(Some(taken));
            }
        }
        // Too few free: all or nothing.
        give_back(taken, kept);
        Ok(None)
    }

    /// With a slot taken: the shared lock on the count file, and the count
    /// read again under it. The count file, locked, for the permit; `None`
    /// (nothing locked) if a writer holds it or changed the number.
    fn confirm_count(
        &self,
        req: &PermitRequest,
        files: &SemFiles,
        kept: &mut Kept,
    ) -> Result<Option<File>, LockError> {
        let fail = |e| self.failed("cannot lock the semaphore's count", &files.count, e);
        let Some(count) = kept.count.take() else {
            return Ok(None);
        };
        if !lock_file::try_lock_shared(&count).map_err(fail)? {
            kept.count = Some(count);
            std::thread::yield_now();
            return Ok(None);
        }
        let confirmed = lock_file::is_current(&self.dir, &files.count, &count)
            .and_then(|current| Ok(current && read_count(&count)? == Some(req.permits)));
        match confirmed {
            Ok(true) => Ok(Some(count)),
            other => {
                lock_file::unlock(&count);
                kept.count = Some(count);
                other.map(|_| None).map_err(fail)
            }
        }
    }

    /// Registers the permit: its `req.count` slots locked, `count` kept
    /// shared. The first slot is the lease's file; the others, then the
    /// count file, go with it (checked at each renewal, closed with it).
    fn grant(
        &self,
        req: &PermitRequest,
        taken: Vec<Taken>,
        count: File,
        sent: Instant,
    ) -> Option<Lease> {
        let valid_until = lease_deadline(sent, req.ttl);
        let mut taken = taken.into_iter().map(|(_, file, name)| (file, name));
        // (`take_slots` gives `req.count` ≥ 1 slots.)
        let (slot, name) = taken.next()?;
        let resource = self.config.dir.join(&name).display().to_string();
        let lease = Lease::unfenced(&req.name, &req.token, req.ttl, valid_until, resource);
        self.hold(&req.token, slot, name, None, req.ttl, valid_until);
        for (slot, name) in taken {
            self.attach(&req.token, slot, name);
        }
        self.attach(&req.token, count, self.sem_files(&req.name).count);
        Some(lease)
    }
}

/// Unlocks the slots of a failed attempt without closing them (a close
/// would wake the other waiters).
fn give_back(taken: Vec<Taken>, kept: &mut Kept) {
    for (i, slot, _) in taken {
        lock_file::unlock(&slot);
        kept.slots[i] = Some(slot);
    }
}

#[async_trait]
impl PermitBackend for FileBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let files = self.sem_files(&req.name);
        // A waiter in line goes first, even with enough slots free for this one.
        if let Ahead::Ticket(_) = self.ahead_of(&files.stem, None)? {
            return Ok(None);
        }
        self.permit_attempt(req, &files, &mut Kept::default())
    }

    fn many_permits(&self) -> bool {
        true
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let files = self.sem_files(&req.name);
        let mut kept = Kept::default();
        if let Ahead::Nobody = self.ahead_of(&files.stem, None)?
            && let Some(lease) = self.permit_attempt(req, &files, &mut kept)?
        {
            return Ok(Some(lease));
        }
        // In line until granted; dropped with this future, the ticket
        // leaves the line.
        let mut ticket = self.take_ticket(&files.stem)?;
        // The slots' and the count file's watches, made when first in line.
        let mut slot_watches: Option<Vec<watch::Watch>> = None;
        loop {
            if !self.ticket_is_current(&ticket)? {
                // Removed under its waiter: stand in line again.
                ticket = self.take_ticket(&files.stem)?;
            }
            let ahead = self.ahead_of(&files.stem, Some(&ticket))?;
            let watches: Vec<watch::Watch> = match &ahead {
                Ahead::Ticket(name) => watch::watch_departure(&self.config.dir.join(name))
                    .ok()
                    .into_iter()
                    .collect(),
                Ahead::Nobody => Vec::new(),
            };
            let watches = match (&ahead, &slot_watches) {
                (Ahead::Nobody, Some(_)) => slot_watches.as_ref().map_or(&watches, |w| w),
                (Ahead::Nobody, None) => {
                    // Every file exists once an attempt opened them: so
                    // attempt (in the loop below) before the first wait.
                    let mut names: Vec<String> = (0..req.permits).map(|i| files.slot(i)).collect();
                    names.push(files.count.clone());
                    slot_watches = Some(
                        names
                            .iter()
                            .filter_map(|name| watch::watch(&self.config.dir.join(name)).ok())
                            .collect(),
                    );
                    slot_watches.as_ref().map_or(&watches, |w| w)
                }
                (Ahead::Ticket(_), _) => &watches,
            };
            let mut woken: Vec<Pin<Box<tokio::sync::futures::Notified<'_>>>> = watches
                .iter()
                .map(|w| Box::pin(w.notify().notified()))
                .collect();
            for notified in &mut woken {
                notified.as_mut().enable();
            }
            // Looked at after the watches are armed: a change from here on wakes it.
            match &ahead {
                Ahead::Nobody => {
                    if let Some(lease) = self.permit_attempt(req, &files, &mut kept)? {
                        return Ok(Some(lease));
                    }
                }
                Ahead::Ticket(name) => {
                    if !self.ticket_is_live(name)? {
                        continue;
                    }
                }
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Ok(None);
            }
            let nap = deadline.map_or(now + RECHECK, |d| d.min(now + RECHECK));
            let any = async {
                if woken.is_empty() {
                    std::future::pending::<()>().await;
                } else {
                    futures_util::future::select_all(woken).await;
                }
            };
            tokio::select! {
                () = any => {}
                () = tokio::time::sleep_until(nap.into()) => {}
            }
        }
    }

    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        leases.iter().map(|lease| self.renew_one(lease)).collect()
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.let_go(&lease.token))
    }

    async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        self.free_permits(name, permits)
    }

    async fn inspect_semaphore(
        &self,
        name: &str,
    ) -> Result<crate::backend::SemaphoreInfo, LockError> {
        self.semaphore_info(name)
    }

    async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.semaphores_named(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_count;

    #[test]
    fn a_count_is_a_positive_number_on_the_first_line() {
        assert_eq!(parse_count("3\n"), Some(3));
        assert_eq!(parse_count(" 12 \nrest"), Some(12));
        assert_eq!(parse_count(""), None);
        assert_eq!(parse_count("0\n"), None);
        assert_eq!(parse_count("three"), None);
    }
}
