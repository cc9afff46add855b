//! Lock names: what `GET_LOCK` is given for a key.
//!
//! The name of key `k` under prefix `p` is `p:k` when that is at most 64
//! characters (MySQL 8 refuses longer names; MariaDB 10.11 takes up to
//! 192 bytes) and `k` does not start with `#`; otherwise it is
//! `p:#<hex>`, the first hex digits of SHA-256 of `p:k`, as many as fit in
//! 64 characters (at least 32: the prefix is at most 30 characters). A key
//! starting with `#` is always hashed, so no key's plain name is another's
//! hashed one. The key itself is kept in dlock's table beside the name, for
//! `inspect` and `list`.

use sha2::{Digest, Sha256};

/// The start of the namespace of lock names when `?prefix=` is not given
/// (`dlock.<database>`, see [`default_prefix`]).
pub(crate) const DEFAULT_PREFIX: &str = "dlock";
/// The longest prefix, in characters: a hashed name is the prefix, `:#`
/// and at least 32 hex digits, within the 64 characters MySQL 8 takes.
pub(super) const MAX_PREFIX_CHARS: usize = 30;

/// The longest name MySQL 8 takes, in characters.
pub const MAX_NAME_CHARS: usize = 64;

/// The lock name of `key` under the default prefix of `database` (the
/// URL's database, see [`default_prefix`]): what SQL code passes to
/// `GET_LOCK` to take the same lock.
///
/// ```
/// use dlock::backends::mysql::lock_name;
/// assert_eq!(lock_name("app", "nightly-report"), "dlock.app:nightly-report");
/// let long = lock_name("app", &"x".repeat(100));
/// assert!(long.starts_with("dlock.app:#") && long.chars().count() == 64);
/// ```
pub fn lock_name(database: &str, key: &str) -> String {
    lock_name_in(&default_prefix(database), key)
}

/// The prefix of lock names when the URL gives no `?prefix=`:
/// `dlock.<database>`, so that applications on one server with different
/// databases never share a lock by accident (named locks are global to the
/// server). A database name that would make it longer than 30 characters,
/// or that holds a `:` or starts with `#`, is replaced by `#` and hex
/// digits of its SHA-256 (`dlock.#…`, 30 characters). Before 0.x (see the
/// CHANGELOG) the default was `dlock` whatever the database.
///
/// ```
/// use dlock::backends::mysql::default_prefix;
/// assert_eq!(default_prefix("billing"), "dlock.billing");
/// let long = default_prefix(&"d".repeat(40));
/// assert!(long.starts_with("dlock.#") && long.chars().count() == 30);
/// ```
pub fn default_prefix(database: &str) -> String {
    let plain = format!("{}.{database}", DEFAULT_PREFIX);
    if plain.chars().count() <= MAX_PREFIX_CHARS
        && !database.contains(':')
        && !database.starts_with('#')
    {
        return plain;
    }
    let digest = Sha256::digest(database.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let head = format!("{}.#", DEFAULT_PREFIX);
    let room = MAX_PREFIX_CHARS - head.chars().count();
    format!("{head}{}", &hex[..room])
}

/// The lock name of `key` under `prefix` (see the module docs of
/// [`mysql`](super)).
///
/// ```
/// use dlock::backends::mysql::lock_name_in;
/// assert_eq!(lock_name_in("jobs", "a"), "jobs:a");
/// assert!(lock_name_in("jobs", "#a").starts_with("jobs:#"));
/// ```
pub fn lock_name_in(prefix: &str, key: &str) -> String {
    let full = format!("{prefix}:{key}");
    if full.chars().count() <= MAX_NAME_CHARS && !key.starts_with('#') {
        return full;
    }
    let digest = Sha256::digest(full.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let room = MAX_NAME_CHARS
        .saturating_sub(prefix.chars().count() + 2)
        .clamp(32, 64);
    format!("{prefix}:#{}", &hex[..room])
}

/// `bytes` as an SQL hexadecimal literal, `X'…'`: how every name, key and
/// token goes into a statement (nothing to escape, whatever the bytes and
/// the server's `sql_mode`).
pub(super) fn hex_literal(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // A renewal round writes thousands of these: one allocation each.
    let mut s = String::with_capacity(bytes.len() * 2 + 3);
    s.push_str("X'");
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s.push('\'');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_hash_like_keys_are_hashed_within_64_characters() {
        assert_eq!(lock_name_in("p", "k"), "p:k");
        let at_limit = "k".repeat(62);
        assert_eq!(lock_name_in("p", &at_limit), format!("p:{at_limit}"));
        let over = lock_name_in("p", &"k".repeat(63));
        assert_eq!(over.chars().count(), 64);
        assert!(over.starts_with("p:#"));
        assert_ne!(over, lock_name_in("p", &"k".repeat(64)));
        assert!(lock_name_in("p", "#x").starts_with("p:#"));
        let wide = lock_name_in("p", &"é".repeat(63));
        assert!(wide.starts_with("p:#"), "{wide}");
        assert_eq!(lock_name_in("p", &"é".repeat(62)).chars().count(), 64);
        let long_prefix = "a".repeat(30);
        assert_eq!(
            lock_name_in(&long_prefix, &"k".repeat(40)).chars().count(),
            64
        );
    }

    #[test]
    fn default_prefixes_fit_and_differ_by_database() {
        assert_eq!(default_prefix("a"), "dlock.a");
        assert_ne!(default_prefix("a"), default_prefix("b"));
        for db in ["x".repeat(64), "a:b".into(), "#h".into(), "é".repeat(30)] {
            let p = default_prefix(&db);
            assert!(p.starts_with("dlock.#"), "{p}");
            assert_eq!(p.chars().count(), 30);
        }
        assert_eq!(default_prefix(&"x".repeat(24)).chars().count(), 30);
    }

    #[test]
    fn hex_literals() {
        assert_eq!(hex_literal(b"a'b"), "X'612762'");
        assert_eq!(hex_literal(b""), "X''");
    }
}
