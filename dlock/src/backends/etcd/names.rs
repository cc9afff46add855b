//! How lock keys and semaphore names become etcd key prefixes.
//!
//! A key is one path segment: `%` and `/` become `%25` and `%2F`, so `a` and
//! `a/b` get the directories `<prefix>/a/` and `<prefix>/a%2Fb/`, and neither
//! contains the other's entries. Every other byte stays as it is, so a key
//! without `/` and `%` keeps the `etcdctl lock <prefix>/<key>` layout.

use std::borrow::Cow;

/// The kinds of names, each under a root of its own (`<prefix>/` for the
/// plain locks, `<prefix>-rw/`, `<prefix>-semaphores/`, `<prefix>-election/`),
/// so that one name may be a lock, a read-write lock, a semaphore and an
/// election at once.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Lock,
    Rw,
    Semaphore,
    Election,
}

impl Kind {
    /// Every kind, plain locks first.
    pub(super) const ALL: [Kind; 4] = [Kind::Lock, Kind::Rw, Kind::Semaphore, Kind::Election];

    /// What follows the prefix in this kind's root.
    fn suffix(self) -> &'static str {
        match self {
            Kind::Lock => "",
            Kind::Rw => "-rw",
            Kind::Semaphore => "-semaphores",
            Kind::Election => "-election",
        }
    }
}

/// `<prefix><kind's suffix>/`: the root of every name of `kind`.
pub(super) fn root(prefix: &str, kind: Kind) -> String {
    format!("{prefix}{}/", kind.suffix())
}

/// `key` as one segment of an etcd key: `%` → `%25`, `/` → `%2F`.
///
/// Injective: `%` is escaped itself, so every `%` in the output starts one
/// of the two escapes, and the output decodes back to exactly one key.
pub(super) fn escape(key: &str) -> Cow<'_, str> {
    if !key.contains(['%', '/']) {
        return Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The inverse of [`escape`], read left to right: `%2F` → `/`, `%25` → `%`
/// (any other `%` stays, as a key written by another client may have it).
pub(super) fn unescape(segment: &str) -> String {
    if !segment.contains('%') {
        return segment.to_owned();
    }
    let mut out = String::with_capacity(segment.len());
    let mut rest = segment;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = &rest[at..];
        if let Some(after) = escape.strip_prefix("%2F") {
            out.push('/');
            rest = after;
        } else if let Some(after) = escape.strip_prefix("%25") {
            out.push('%');
            rest = after;
        } else {
            out.push('%');
            rest = &escape[1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_without_slash_or_percent_keep_their_layout() {
        for key in ["order:42", "tenant-7", "ünïcode", "a b", "#?&=", ""] {
            assert_eq!(escape(key), key);
        }
    }

    #[test]
    fn escaped_keys_are_one_segment_and_round_trip() {
        let keys = [
            "a/b",
            "a%2Fb",
            "a%b",
            "a%25b",
            "/",
            "%",
            "%2F",
            "//",
            "a/",
            "/a",
            "tenant/7/order",
        ];
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            let segment = escape(key);
            assert_eq!(unescape(&segment), key);
            assert!(!segment.contains('/'), "{key:?} -> {segment}");
            assert_eq!(unescape(&segment), key, "{segment}");
            assert!(seen.insert(segment.into_owned()), "two keys map to one");
        }
        assert_eq!(escape("tenant/7"), "tenant%2F7");
        assert_eq!(escape("100%"), "100%25");
    }
}
