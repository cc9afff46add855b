//! What dlock trusts in its directory: a file it locks, counts fences in
//! or reads a record from must be a regular file of dlock's own user (or
//! root), writable by nobody else, since whoever can write or replace it
//! can read the record, hold the lock, move it away or send the fence
//! counter anywhere. With `?mode=` granting the group read and write (a
//! directory shared by the users of one group), a file of another member
//! is trusted if its group is the directory's. A FIFO, socket or device at
//! a lock's name is refused without blocking (every open is `O_NONBLOCK`,
//! then `fstat`).
//!
//! The fence counter is checked too: text that is not a number, a value
//! no clock could have given (at or above 2^63 µs, some 292,000 years), or
//! one below a fence this backend issued for the key, is an error, never a
//! reset or a silent saturation.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Mutex;

use rustix::fs::FileType;

/// The highest fence counter believed: 2^63 µs after the epoch.
pub(super) const MAX_PLAUSIBLE_FENCE: u64 = 1 << 63;

/// A file dlock refuses to use, and why (the message names the file, its
/// owner and mode, and what to do).
#[derive(Debug)]
pub(super) struct Untrusted(pub(super) String);

/// How many keys' last issued fences a backend remembers.
const ISSUED_KEYS: usize = 4_096;

/// Who may own and write the files of one backend, and the fences it
/// issued.
#[derive(Debug)]
pub(super) struct Trust {
    /// The permission bits dlock creates files with (`?mode=`).
    pub(super) mode: u32,
    /// dlock's user: the effective uid of this process.
    euid: u32,
    /// The directory's group, trusted as an owner when `mode` gives the
    /// group read and write.
    shared_gid: Option<u32>,
    /// The last fence this backend issued per key stem: a counter found
    /// lower is an error.
    issued: Mutex<HashMap<String, u64>>,
}

impl Trust {
    pub(super) fn new(mode: u32, dir_gid: u32) -> Self {
        Trust {
            mode,
            euid: rustix::process::geteuid().as_raw(),
            shared_gid: (mode & 0o060 == 0o060).then_some(dir_gid),
            issued: Mutex::default(),
        }
    }

    /// Checks the open `file` (named `shown` in the message) is one dlock
    /// may use.
    pub(super) fn check(&self, file: &impl AsFd, shown: &str) -> Result<(), Untrusted> {
        let stat = rustix::fs::fstat(file)
            .map_err(|e| Untrusted(format!("cannot stat `{shown}`: {e}")))?;
        let kind = FileType::from_raw_mode(stat.st_mode);
        let mode = stat.st_mode & 0o7777;
        if kind != FileType::RegularFile {
            return Err(Untrusted(format!(
                "`{shown}` is not a regular file but a {} (mode {mode:04o}, owner {}): dlock's lock and fence files are regular files; remove it (`rm '{shown}'`) and find out who made it",
                kind_name(kind),
                owner_name(stat.st_uid),
            )));
        }
        let owner_ok =
            stat.st_uid == self.euid || stat.st_uid == 0 || self.shared_gid == Some(stat.st_gid);
        let foreign_write = mode & 0o022 & !self.mode;
        if !owner_ok || foreign_write != 0 {
            let why = if owner_ok {
                format!(
                    "writable by {}",
                    if foreign_write & 0o002 != 0 {
                        "every user"
                    } else {
                        "its group"
                    }
                )
            } else {
                format!("not owned by dlock's user (uid {}) or root", self.euid)
            };
            return Err(Untrusted(format!(
                "`{shown}` is owned by {} (gid {}) with mode {mode:04o}, {why}: another user could read its record, hold the lock, move it away or change the fence counter, so dlock does not use it (`?mode={:04o}` allows group write only when it grants it); remove the file if nothing of yours holds it, and keep the directory writable only by the users that share the locks",
                owner_name(stat.st_uid),
                stat.st_gid,
                self.mode,
            )));
        }
        Ok(())
    }

    /// Checks the fence counter `text` of `stem` and gives its value (0 for
    /// an empty, new counter).
    pub(super) fn counter(&self, stem: &str, text: &str, shown: &str) -> Result<u64, Untrusted> {
        let line = text.lines().next().unwrap_or("").trim();
        if line.is_empty() {
            return Ok(0);
        }
        let last: u64 = line.parse().map_err(|_| {
            Untrusted(format!(
                "the fence counter `{shown}` holds `{}`, not a number: dlock writes only a decimal number there, so something else wrote it; fencing tokens must never repeat or go back, so dlock does not guess: restore the last token (or a larger one) into it, or remove it only if no holder's token can still be in use",
                line.chars().take(40).collect::<String>()
            ))
        })?;
        if last >= MAX_PLAUSIBLE_FENCE {
            return Err(Untrusted(format!(
                "the fence counter `{shown}` holds {last}, more than any clock gives (at most {MAX_PLAUSIBLE_FENCE}): counting on would reach u64::MAX and repeat tokens; someone wrote it by hand or by mistake: write the last token actually issued into it"
            )));
        }
        if let Some(&issued) = lock(&self.issued).get(stem)
            && last < issued
        {
            return Err(Untrusted(format!(
                    "the fence counter `{shown}` holds {last}, below {issued}, a token this process already issued: it was set back, and the next token would be lower than one given before; write {issued} (or more) into it"
                )));
        }
        Ok(last)
    }

    /// Remembers `fence` as issued for `stem`. At most [`ISSUED_KEYS`]
    /// keys are remembered: a process that locks a new key per entity
    /// (`order:{id}`) for days must not grow without bound, so a new key
    /// past the bound forgets another one (whose set-back counter is then
    /// caught only by the clock floor, as after a restart).
    pub(super) fn issued(&self, stem: &str, fence: u64) {
        let mut issued = lock(&self.issued);
        if issued.len() >= ISSUED_KEYS
            && !issued.contains_key(stem)
            && let Some(forgotten) = issued.keys().next().cloned()
        {
            issued.remove(&forgotten);
        }
        let at = issued.entry(stem.to_owned()).or_insert(0);
        *at = (*at).max(fence);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update is one map operation.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::Fifo => "FIFO (named pipe)",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        _ => "special file",
    }
}

/// `uid N (name)`, the name from `/etc/passwd` when it is there.
pub(super) fn owner_name(uid: u32) -> String {
    let name = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                let id: u32 = fields.nth(1)?.parse().ok()?;
                (id == uid).then(|| name.to_owned())
            })
        });
    match name {
        Some(name) => format!("uid {uid} ({name})"),
        None => format!("uid {uid}"),
    }
}

/// A random suffix for a temporary file's name, so another user cannot
/// create it first; 0 when the system gives no randomness (the name is
/// then still opened with `O_EXCL`, which fails rather than adopt one).
pub(super) fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    format!("{:016x}", u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_counters_that_are_not_plausible_are_errors() {
        let trust = Trust::new(0o600, 0);
        assert_eq!(trust.counter("k", "", "f").unwrap(), 0);
        assert_eq!(trust.counter("k", "42   \n", "f").unwrap(), 42);
        assert!(trust
            .counter("k", "x1\n", "f")
            .unwrap_err()
            .0
            .contains("not a number"));
        assert!(trust
            .counter("k", "18446744073709551614\n", "f")
            .unwrap_err()
            .0
            .contains("more than any clock"));
        trust.issued("k", 100);
        assert!(trust
            .counter("k", "0\n", "f")
            .unwrap_err()
            .0
            .contains("below 100"));
        assert_eq!(trust.counter("k", "100\n", "f").unwrap(), 100);
        assert_eq!(trust.counter("other", "0\n", "f").unwrap(), 0);
    }

    #[test]
    fn the_issued_fences_remembered_stay_bounded() {
        let trust = Trust::new(0o600, 0);
        for i in 0..ISSUED_KEYS * 3 {
            trust.issued(&format!("k{i}"), 7);
        }
        assert_eq!(lock(&trust.issued).len(), ISSUED_KEYS);
        // The newest key is remembered: its set-back counter is refused.
        let newest = format!("k{}", ISSUED_KEYS * 3 - 1);
        assert!(trust.counter(&newest, "0\n", "f").is_err());
    }
}
