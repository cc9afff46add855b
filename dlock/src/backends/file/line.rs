//! The line of a semaphore's waiters, in arrival order: `flock` grants
//! no order, so a waiting taker of several permits would be overtaken by
//! later takers of one. A waiter stands in line with a ticket,
//! `<stem>~turn~<number>` (20 digits), and only the first live ticket may
//! take slots; a `try_acquire` finding a live ticket takes nothing.
//!
//! - A ticket is locked before it is visible: it is made as a temporary
//!   file, locked `flock(LOCK_EX)`, then hard-linked at its number
//!   (`linkat` fails on a taken number: the next is tried). So a ticket
//!   at its name that a `LOCK_SH` probe can lock is a dead waiter's: the
//!   kernel dropped its lock with its process. The first waiter behind it
//!   removes it (if still the file probed).
//! - Numbers: one more than the highest ticket in the directory, so a
//!   ticket is behind every ticket that was visible when it was made.
//! - Leaving the line (a grant, a deadline, a dropped wait) removes the
//!   name, then closes the file: the waiter behind, watching the ticket in
//!   front of it (`watch::watch_departure`), wakes on either. Probes open
//!   tickets read-only, an event such a watch does not take.
//!
//! A waiter reads the directory's names at each look at the line: a
//! semaphore's waiters cost a directory read per wake-up.

use std::fs::File;
use std::os::fd::OwnedFd;

use rustix::fs::AtFlags;
use rustix::io::Errno;

use super::lock_file::{self, FileError};
use super::FileBackend;
use crate::LockError;

/// Between a semaphore's stem and a ticket's number.
const TURN: &str = "~turn~";

/// How many taken numbers one ticket skips before it gives up (each skip
/// is another waiter's ticket made in the same instant).
const TRIES: u64 = 1_000;

/// A waiter's place in line: its ticket file, locked, at `name`. Dropped,
/// it leaves the line (name removed, then file closed).
pub(super) struct Ticket {
    /// The directory (a descriptor of its own: a dropped wait removes
    /// its ticket without the backend).
    dir: OwnedFd,
    file: File,
    name: String,
    number: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if matches!(
            lock_file::is_current(&self.dir, &self.name, &self.file),
            Ok(true)
        ) {
            let _ = rustix::fs::unlinkat(&self.dir, &self.name, AtFlags::empty());
        }
        lock_file::unlock(&self.file);
    }
}

/// The ticket number of the file `name` of the semaphore `stem`.
fn number_of(stem: &str, name: &str) -> Option<u64> {
    let digits = name.strip_prefix(stem)?.strip_prefix(TURN)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

fn ticket_name(stem: &str, number: u64) -> String {
    format!("{stem}{TURN}{number:020}")
}

/// What the look at the line found in front of a waiter.
pub(super) enum Ahead {
    /// Nobody: the waiter may take slots.
    Nobody,
    /// The nearest live ticket in front, by name.
    Ticket(String),
}

impl FileBackend {
    fn line_failed(&self, stem: &str, e: impl Into<FileError>) -> LockError {
        self.failed(
            "cannot read the semaphore's line",
            &format!("{stem}{TURN}*"),
            e,
        )
    }

    /// The ticket numbers of `stem` in the directory, lowest first.
    fn ticket_numbers(&self, stem: &str) -> Result<Vec<u64>, LockError> {
        let dir = rustix::fs::Dir::read_from(&self.dir).map_err(|e| self.line_failed(stem, e))?;
        let mut numbers = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| self.line_failed(stem, e))?;
            if let Some(number) = entry
                .file_name()
                .to_str()
                .ok()
                .and_then(|name| number_of(stem, name))
            {
                numbers.push(number);
            }
        }
        numbers.sort_unstable();
        Ok(numbers)
    }

    /// Whether the ticket `name` belongs to a living waiter; a dead one's
    /// is removed.
    pub(super) fn ticket_is_live(&self, name: &str) -> Result<bool, LockError> {
        let fail = |e| self.failed("cannot read a ticket of the semaphore's line", name, e);
        let Some(file) = lock_file::open_existing(&self.dir, name, &self.trust).map_err(fail)?
        else {
            return Ok(false);
        };
        if !lock_file::try_lock_shared(&file).map_err(|e| fail(e.into()))? {
            return Ok(true);
        }
        // Locked before it was linked, so its waiter died: remove it, if
        // the name is still this file.
        if lock_file::is_current(&self.dir, name, &file).map_err(|e| fail(e.into()))? {
            tracing::debug!(file = name, "removing a dead waiter's ticket");
            let _ = rustix::fs::unlinkat(&self.dir, name, AtFlags::empty());
        }
        lock_file::unlock(&file);
        Ok(false)
    }

    /// The nearest live ticket of `stem` in front of `mine` (`None`: in
    /// front of a newcomer, so any live ticket).
    pub(super) fn ahead_of(&self, stem: &str, mine: Option<&Ticket>) -> Result<Ahead, LockError> {
        let numbers = self.ticket_numbers(stem)?;
        let limit = mine.map_or(u64::MAX, |t| t.number);
        // From the nearest down: the usual case probes one ticket.
        for number in numbers.into_iter().rev().filter(|n| *n < limit) {
            let name = ticket_name(stem, number);
            if self.ticket_is_live(&name)? {
                return Ok(Ahead::Ticket(name));
            }
        }
        Ok(Ahead::Nobody)
    }

    /// Whether `ticket` is still at its name (an operator, or a prober
    /// that took it for dead in a race, may have removed it).
    pub(super) fn ticket_is_current(&self, ticket: &Ticket) -> Result<bool, LockError> {
        lock_file::is_current(&self.dir, &ticket.name, &ticket.file)
            .map_err(|e| self.failed("cannot check a ticket", &ticket.name, e))
    }

    /// Stands in line for the semaphore `stem`: a ticket behind every
    /// ticket there now.
    pub(super) fn take_ticket(&self, stem: &str) -> Result<Ticket, LockError> {
        let (file, temporary) =
            lock_file::create_temporary(&self.dir, &format!("{stem}~turn"), &self.trust)
                .map_err(|e| self.line_failed(stem, e))?;
        let linked = self.link_ticket(stem, &file, &temporary);
        let _ = rustix::fs::unlinkat(&self.dir, &temporary, AtFlags::empty());
        let (name, number) = linked?;
        let dir = self
            .dir
            .try_clone()
            .map_err(|e| self.line_failed(stem, Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
        Ok(Ticket {
            dir,
            file,
            name,
            number,
        })
    }

    fn link_ticket(
        &self,
        stem: &str,
        file: &File,
        temporary: &str,
    ) -> Result<(String, u64), LockError> {
        let fail = |e: Errno| self.line_failed(stem, e);
        if !lock_file::try_lock(file).map_err(fail)? {
            // A new file nobody else opened.
            return Err(fail(Errno::AGAIN));
        }
        let last = self.ticket_numbers(stem)?.last().copied().unwrap_or(0);
        for number in last.saturating_add(1)..last.saturating_add(TRIES) {
            let name = ticket_name(stem, number);
            match rustix::fs::linkat(&self.dir, temporary, &self.dir, &name, AtFlags::empty()) {
                Ok(()) => return Ok((name, number)),
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(fail(e)),
            }
        }
        Err(fail(Errno::EXIST))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_names_carry_their_number() {
        let name = ticket_name("p~sem~a", 42);
        assert_eq!(name, "p~sem~a~turn~00000000000000000042");
        assert_eq!(number_of("p~sem~a", &name), Some(42));
        assert_eq!(number_of("p~sem~ab", &name), None);
        assert_eq!(number_of("p~sem~a", "p~sem~a~turn~42"), None);
        assert_eq!(number_of("p~sem~a", "p~sem~a~turn.0123.tmp"), None);
    }
}
