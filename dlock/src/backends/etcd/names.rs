//! How lock keys and semaphore names become etcd key prefixes.
//!
//! A key is one path segment: `%` and `/` become `%25` and `%2F`, so `a` and
//! `a/b` get the directories `<prefix>/a/` and `<prefix>/a%2Fb/`, and neither
//! contains the other's entries. Every other byte stays as it is, so a key
//! without `/` and `%` keeps the `etcdctl lock <prefix>/<key>` layout.

use std::borrow::Cow;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The inverse of [`escape`], to show it is injective.
    fn unescape(segment: &str) -> String {
        segment.replace("%2F", "/").replace("%25", "%")
    }

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
            assert!(!segment.contains('/'), "{key:?} -> {segment}");
            assert_eq!(unescape(&segment), key, "{segment}");
            assert!(seen.insert(segment.into_owned()), "two keys map to one");
        }
        assert_eq!(escape("tenant/7"), "tenant%2F7");
        assert_eq!(escape("100%"), "100%25");
    }
}
