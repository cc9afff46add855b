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

/// The longest name MySQL 8 takes, in characters.
pub const MAX_NAME_CHARS: usize = 64;

/// The lock name of `key` under the default prefix `dlock`: what SQL code
/// passes to `GET_LOCK` to take the same lock.
///
/// ```
/// use dlock::backends::mysql::lock_name;
/// assert_eq!(lock_name("nightly-report"), "dlock:nightly-report");
/// let long = lock_name(&"x".repeat(100));
/// assert!(long.starts_with("dlock:#") && long.chars().count() == 64);
/// ```
pub fn lock_name(key: &str) -> String {
    lock_name_in(super::config::DEFAULT_PREFIX, key)
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
    fn hex_literals() {
        assert_eq!(hex_literal(b"a'b"), "X'612762'");
        assert_eq!(hex_literal(b""), "X''");
    }
}
