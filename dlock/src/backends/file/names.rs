//! The file names of a key: a lock key becomes one name inside the
//! directory, never a path. Bytes other than ASCII letters, digits, `-`,
//! `_`, `.` and `:` are written `%XX`, so no name holds a `/` or a NUL
//! (and `..` is only part of a longer name); a name that would be longer
//! than [`MAX_STEM`] bytes is the key's SHA-256 instead (`#` and 32 hex
//! digits), the key itself then kept in the lock file's record for
//! `inspect` and `list`. The prefix comes first, then `~`, a character no
//! prefix and no escaped key holds, so two prefixes never share a name.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

/// The lock file's ending.
pub(super) const LOCK: &str = ".lock";
/// The fence counter's ending.
pub(super) const FENCE: &str = ".fence";
/// The ending of a file being written before it is renamed into place (a
/// forced release's new lock file, a leader's record).
pub(super) const TEMPORARY: &str = ".tmp";
/// The ending of an election's leader record, beside the lock file.
pub(super) const LEADER: &str = ".leader";
/// Between the prefix and the key.
const SEPARATOR: char = '~';
/// Starts the name of a hashed key.
const HASHED: char = '#';
/// The longest stem (`<prefix>~<key>`), in bytes: with the longest ending
/// (`.fence.<pid>-<n>.tmp`) it stays well inside the 255 bytes of a file
/// name on every Linux file system.
pub(super) const MAX_STEM: usize = 200;

/// Between the prefix and the key of a read-write lock's files: `rw~`
/// (the `~` of a key is escaped, so no lock key's files start so).
const RW: &str = "rw~";

/// Between the prefix and the name of a semaphore's files: `sem~` (as
/// `rw~`, no lock key's files start so).
const SEM: &str = "sem~";

/// Between the prefix and the name of a count-down latch's file: `latch~`.
const LATCH: &str = "latch~";

/// The ending of a latch's count file.
pub(super) const COUNT: &str = ".count";

/// Between the prefix and the name of a barrier's files: `barrier~`.
const BARRIER: &str = "barrier~";

/// `<prefix>~<escaped key>`, or `<prefix>~#<hash>` for a long key: the
/// stem of every file of the key.
pub(super) fn stem(prefix: &str, key: &str) -> String {
    stem_in(prefix, "", key)
}

/// The stem of the files of the read-write lock `key`:
/// `<prefix>~rw~<escaped key>` (or hashed).
pub(super) fn rw_stem(prefix: &str, key: &str) -> String {
    stem_in(prefix, RW, key)
}

/// The stem of the files of the semaphore `name`:
/// `<prefix>~sem~<escaped name>` (or hashed). Its files add `~count` and
/// `~<slot>.lock` (a `~` no escaped name holds, so no two names share one).
pub(super) fn sem_stem(prefix: &str, name: &str) -> String {
    stem_in(prefix, SEM, name)
}

/// The stem of the count file of the latch `name`:
/// `<prefix>~latch~<escaped name>` (or hashed); the file adds `.count`.
pub(super) fn latch_stem(prefix: &str, name: &str) -> String {
    stem_in(prefix, LATCH, name)
}

/// The stem of the files of the barrier `name`:
/// `<prefix>~barrier~<escaped name>` (or hashed); its members and its
/// `ready` file add `~…`.
pub(super) fn barrier_stem(prefix: &str, name: &str) -> String {
    stem_in(prefix, BARRIER, name)
}

fn stem_in(prefix: &str, kind: &str, key: &str) -> String {
    let prefix = format!("{prefix}{SEPARATOR}{kind}");
    let mut escaped = String::with_capacity(key.len());
    for byte in key.bytes() {
        if kept(byte) {
            escaped.push(char::from(byte));
        } else {
            let _ = write!(escaped, "%{byte:02X}");
        }
    }
    if prefix.len() + escaped.len() > MAX_STEM {
        let digest = Sha256::digest(key.as_bytes());
        escaped = String::from(HASHED);
        for byte in &digest[..16] {
            let _ = write!(escaped, "{byte:02x}");
        }
    }
    format!("{prefix}{escaped}")
}

fn kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b':')
}

/// What a lock file's name says of its key.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Named {
    /// The key, read back from the name.
    Key(String),
    /// A hashed long key: the key is in the file's record only.
    Hashed,
}

/// The key of the lock file `name` of `prefix`; `None` for any other file
/// (another prefix's, a fence counter, a temporary file, a name dlock
/// would not write).
pub(super) fn key_of(prefix: &str, name: &str) -> Option<Named> {
    let escaped = name
        .strip_prefix(prefix)?
        .strip_prefix(SEPARATOR)?
        .strip_suffix(LOCK)?;
    if let Some(hash) = escaped.strip_prefix(HASHED) {
        let hex = hash.len() == 32 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        return hex.then_some(Named::Hashed);
    }
    let key = crate::url::percent_decode(escaped).ok()?;
    // Only the one name dlock writes for the key (not `%41` for `A`).
    (stem(prefix, &key) == format!("{prefix}{SEPARATOR}{escaped}")).then_some(Named::Key(key))
}

/// The name of the semaphore whose count file is `file` under `prefix`
/// (`<prefix>~sem~<escaped name>~count`); `None` for any other file and
/// for a hashed long name (its name is kept nowhere).
pub(super) fn sem_name_of(prefix: &str, file: &str) -> Option<String> {
    let escaped = file
        .strip_prefix(prefix)?
        .strip_prefix(SEPARATOR)?
        .strip_prefix(SEM)?
        .strip_suffix("~count")?;
    let name = crate::url::percent_decode(escaped).ok()?;
    (sem_stem(prefix, &name) == format!("{prefix}{SEPARATOR}{SEM}{escaped}")).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_one_name_inside_the_directory() {
        assert_eq!(stem("dlock", "order:42"), "dlock~order:42");
        assert_eq!(
            stem("dlock", "a/../../etc/passwd"),
            "dlock~a%2F..%2F..%2Fetc%2Fpasswd"
        );
        assert_eq!(stem("dlock", "x\0y"), "dlock~x%00y");
        assert_eq!(stem("dlock", ".."), "dlock~..");
        assert_eq!(stem("dlock", "über"), "dlock~%C3%BCber");
        assert_eq!(stem("dlock", "a~b#c%"), "dlock~a%7Eb%23c%25");
        for key in ["a/b", "..", "/", "x\0", "~", "%2F", "ü", "a b"] {
            let name = format!("{}{LOCK}", stem("p", key));
            assert!(!name.contains('/') && !name.contains('\0'), "{name}");
            assert_eq!(
                key_of("p", &name),
                Some(Named::Key(key.to_owned())),
                "{key}"
            );
        }
    }

    #[test]
    fn semaphore_names_come_back_from_their_count_files() {
        for name in ["exports", "a/b", "x~y", "ü"] {
            let file = format!("{}~count", sem_stem("p", name));
            assert_eq!(sem_name_of("p", &file).as_deref(), Some(name));
        }
        let long = "s".repeat(300);
        assert_eq!(
            sem_name_of("p", &format!("{}~count", sem_stem("p", &long))),
            None
        );
        assert_eq!(sem_name_of("p", "p~sem~exports~0.lock"), None);
        assert_eq!(sem_name_of("q", "p~sem~exports~count"), None);
    }

    #[test]
    fn long_keys_are_hashed() {
        let long = "k/".repeat(256);
        let s = stem("dlock", &long);
        assert!(
            s.starts_with("dlock~#") && s.len() == "dlock~#".len() + 32,
            "{s}"
        );
        assert_eq!(key_of("dlock", &format!("{s}{LOCK}")), Some(Named::Hashed));
        assert_ne!(stem("dlock", &long), stem("dlock", &"k/".repeat(255)));
        let fits = "k".repeat(MAX_STEM - "dlock~".len());
        assert_eq!(stem("dlock", &fits), format!("dlock~{fits}"));
    }

    #[test]
    fn other_files_are_no_locks() {
        assert_eq!(key_of("dlock", "dlock~a.fence"), None);
        assert_eq!(key_of("dlock", "dlock~a.fence.1-2.tmp"), None);
        assert_eq!(key_of("dlock", "other~a.lock"), None);
        assert_eq!(key_of("dlock", "dlockx~a.lock"), None);
        assert_eq!(
            key_of("dlock", "dlock~%41.lock"),
            None,
            "not the name dlock writes for `A`"
        );
        assert_eq!(key_of("dlock", "dlock~a/b.lock"), None);
        assert_eq!(key_of("dlock", "dlock~#xyz.lock"), None);
        assert_eq!(key_of("dlock", "dlock~a.leader"), None);
        let slot = format!("{}~3{LOCK}", sem_stem("dlock", "a"));
        assert_eq!(slot, "dlock~sem~a~3.lock");
        assert_eq!(
            key_of("dlock", &slot),
            None,
            "a semaphore's slot is no lock"
        );
        assert_eq!(
            key_of("dlock", "dlock~x.lock"),
            Some(Named::Key("x".into()))
        );
        assert_eq!(
            key_of("dlock", "dlock~x.lock.lock"),
            Some(Named::Key("x.lock".into()))
        );
    }
}
