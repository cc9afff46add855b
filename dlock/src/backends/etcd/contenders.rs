//! Which keys under a line's directory are its entries: only its direct
//! children.
//!
//! etcd has no directories, only key ranges: a range read of `dlock/tenant/`
//! also returns `dlock/tenant/7/<lease>`, the entry of `etcdctl lock
//! dlock/tenant/7` (or of a backend with `?prefix=dlock/tenant`), which is
//! another resource. A key with a further `/` after the line's directory is
//! never an owner, a predecessor or a permit holder, whoever wrote it.
//!
//! A range read cannot leave such keys out, so the reads here go by pages
//! (sorted by revision, each page starting past the last one) and skip them;
//! a page full of deeper keys costs another read, never a wrong answer.

use etcd_client::{GetOptions, GetResponse, KeyValue, SortOrder, SortTarget, TxnOpResponse};

/// How many keys one read of a line asks for: enough that a line shared
/// with a few deeper keys is still read at once.
pub(super) const PAGE: i64 = 32;

/// The entries of one line: `<dir><kind><seg>`, where `<kind>` is one of
/// `kinds` and `<seg>` is a non-empty name without `/`.
#[derive(Clone, Copy)]
pub(super) struct Contenders<'a> {
    /// The line's directory, ending with `/`.
    pub(super) dir: &'a str,
    /// `[""]` for a mutex or a semaphore (`<dir><lease-hex>`); `["write/"]`
    /// for what a reader waits for, `["read/", "write/"]` for a writer.
    pub(super) kinds: &'static [&'static str],
}

impl Contenders<'_> {
    /// The directory's entries of any kind: a mutex's or a semaphore's.
    pub(super) const DIRECT: &'static [&'static str] = &[""];

    /// The key range to read: the directory, or its one kind's directory.
    pub(super) fn prefix(&self) -> String {
        match self.kinds {
            [kind] => format!("{}{kind}", self.dir),
            _ => self.dir.to_owned(),
        }
    }

    /// Whether `key` is an entry of this line (not a deeper key, not
    /// another kind).
    pub(super) fn contains(&self, key: &[u8]) -> bool {
        let Some(rest) = key.strip_prefix(self.dir.as_bytes()) else {
            return false;
        };
        self.kinds.iter().any(|kind| {
            rest.strip_prefix(kind.as_bytes())
                .is_some_and(|seg| !seg.is_empty() && !seg.contains(&b'/'))
        })
    }

    /// The first entry of a page (in the page's order).
    pub(super) fn first_in<'k>(&self, page: &'k GetResponse) -> Option<&'k KeyValue> {
        page.kvs().iter().find(|kv| self.contains(kv.key()))
    }

    /// A page of the line: keys only, sorted by `by` in `order`, with
    /// revisions (of `by`) at most `max` when descending or at least `min`
    /// when ascending.
    pub(super) fn page(by: SortTarget, order: SortOrder, bound: Option<i64>) -> GetOptions {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(by, order)
            .with_limit(PAGE)
            .with_keys_only();
        match (bound, by, order) {
            (None, _, _) => options,
            (Some(max), SortTarget::Mod, SortOrder::Descend) => options.with_max_mod_revision(max),
            (Some(max), _, SortOrder::Descend) => options.with_max_create_revision(max),
            (Some(min), SortTarget::Mod, _) => options.with_min_mod_revision(min),
            (Some(min), _, _) => options.with_min_create_revision(min),
        }
    }
}

/// The revision `by` of `kv`.
pub(super) fn revision(kv: &KeyValue, by: SortTarget) -> i64 {
    match by {
        SortTarget::Mod => kv.mod_revision(),
        _ => kv.create_revision(),
    }
}

/// The get of a transaction's `i`-th answer.
pub(super) fn get_of(op: Option<&TxnOpResponse>) -> Option<&GetResponse> {
    match op {
        Some(TxnOpResponse::Get(get)) => Some(get),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_direct_children_of_the_kinds_are_entries() {
        let mutex = Contenders {
            dir: "dlock/tenant/",
            kinds: Contenders::DIRECT,
        };
        assert!(mutex.contains(b"dlock/tenant/694d8a1b"));
        assert!(!mutex.contains(b"dlock/tenant/7/694d8a1b"));
        assert!(!mutex.contains(b"dlock/tenant/"));
        assert!(!mutex.contains(b"dlock/tenant2/1"));
        assert_eq!(mutex.prefix(), "dlock/tenant/");

        let writer = Contenders {
            dir: "dlock-rw/p/",
            kinds: &["read/", "write/"],
        };
        assert!(writer.contains(b"dlock-rw/p/read/17"));
        assert!(writer.contains(b"dlock-rw/p/write/17"));
        assert!(!writer.contains(b"dlock-rw/p/eu/write/17"));
        assert!(!writer.contains(b"dlock-rw/p/write/17/x"));
        assert!(!writer.contains(b"dlock-rw/p/write/"));
        assert!(!writer.contains(b"dlock-rw/p/other"));
        assert_eq!(writer.prefix(), "dlock-rw/p/");

        let reader = Contenders {
            dir: "dlock-rw/p/",
            kinds: &["write/"],
        };
        assert!(!reader.contains(b"dlock-rw/p/read/17"));
        assert!(reader.contains(b"dlock-rw/p/write/17"));
        assert_eq!(reader.prefix(), "dlock-rw/p/write/");
    }
}
