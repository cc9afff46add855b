//! An operator's view of a lock key: the oldest direct entry of the key's
//! directory holds it; its value is the holder's client name (empty for an
//! `etcdctl lock` holder), its create revision the fence, its lease's time
//! to live the time left. A forced release deletes that entry (compared by
//! its create revision), which wakes the next entry's watch.
//!
//! A listing reads the keys of the range `<prefix>/<escaped listing
//! prefix>` by pages in key order; each directory with a direct entry is a
//! lock key (deeper keys, another resource's, are skipped, as
//! `contenders.rs` says), and each is then inspected.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};

use super::contenders::{Contenders, PAGE};
use super::names::Kind;
use super::Inner;
use crate::{LockError, LockInfo};

/// The most pages read for an owner among deeper keys.
const MAX_PAGES: usize = 64;

/// How many keys one page of a listing reads.
const LIST_PAGE: i64 = 512;

/// The most pages one listing reads.
const MAX_LIST_PAGES: usize = 2_000;

/// The end of the key range of every key that starts with `start`
/// (etcd's prefix end: the last byte below 0xff increased, the rest cut).
fn range_end(start: &[u8]) -> Vec<u8> {
    let mut end = start.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the keyspace.
    vec![0]
}

impl Inner {
    /// The entry that holds the lock `key`, with its value.
    async fn owner_of(&self, key: &str) -> Result<Option<KeyValue>, LockError> {
        let dir = self.dir_of(key);
        let line = Contenders {
            dir: &dir,
            kinds: Contenders::DIRECT,
        };
        let mut from = 0;
        for _ in 0..MAX_PAGES {
            let mut options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(PAGE);
            if from > 0 {
                options = options.with_min_create_revision(from);
            }
            let answer = self
                .txn(Txn::new().and_then([TxnOp::get(dir.as_str(), Some(options))]))
                .await?;
            let ops = answer.op_responses();
            let Some(page) = super::contenders::get_of(ops.first()) else {
                return Ok(None);
            };
            if let Some(owner) = line.first_in(page) {
                return Ok(Some(owner.clone()));
            }
            match page.kvs().last() {
                Some(last) if page.kvs().len() as i64 >= PAGE => from = last.create_revision() + 1,
                _ => return Ok(None),
            }
        }
        Err(self.error(format!(
            "more than {} keys below `{dir}` before its first entry",
            MAX_PAGES as i64 * PAGE
        )))
    }

    pub(super) async fn inspect_lock(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let Some(owner) = self.owner_of(key).await? else {
            return Ok(None);
        };
        let remaining = if owner.lease() == 0 {
            Duration::MAX
        } else {
            let id = owner.lease();
            let ttl = self
                .rpc(|| {
                    let mut leases = self.client.lease_client();
                    async move { leases.time_to_live(id, None).await }
                })
                .await?;
            match ttl.ttl() {
                secs if secs >= 0 => Duration::from_secs(secs as u64),
                // The lease ended between the reads.
                _ => return Ok(None),
            }
        };
        let holder = std::str::from_utf8(owner.value())
            .ok()
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        Ok(Some(LockInfo::new(
            remaining,
            u64::try_from(owner.create_revision()).ok(),
            holder,
        )))
    }

    /// The held lock keys that start with `prefix`, each inspected.
    pub(super) async fn list_locks(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, LockInfo)>, LockError> {
        let mut held = Vec::new();
        let root = self.root(Kind::Lock);
        for key in self.names_under(&root, prefix, "locks").await? {
            if let Some(info) = self.inspect_lock(&key).await? {
                held.push((key, info));
            }
        }
        Ok(held)
    }

    /// The names (lock keys, semaphore names: `what`) whose directory under
    /// `root` has a direct entry and that start with `prefix`, sorted; at
    /// most [`MAX_LISTED`](crate::inspect::MAX_LISTED). Read in pages of
    /// keys only, each page starting past the last directory seen, so a
    /// directory of many entries costs one page.
    pub(super) async fn names_under(
        &self,
        root: &str,
        prefix: &str,
        what: &str,
    ) -> Result<Vec<String>, LockError> {
        let first = format!("{root}{}", super::names::escape(prefix));
        let end = range_end(first.as_bytes());
        let mut from = first.into_bytes();
        let mut keys = Vec::new();
        for _ in 0..MAX_LIST_PAGES {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_sort(SortTarget::Key, SortOrder::Ascend)
                .with_limit(LIST_PAGE)
                .with_keys_only();
            let answer = self
                .txn(Txn::new().and_then([TxnOp::get(from.clone(), Some(options))]))
                .await?;
            let ops = answer.op_responses();
            let Some(page) = super::contenders::get_of(ops.first()) else {
                return Ok(keys);
            };
            let mut next = None;
            for kv in page.kvs() {
                let Some(rest) = kv.key().strip_prefix(root.as_bytes()) else {
                    continue;
                };
                // `<escaped key>/<entry>`, the entry without a further `/`.
                let direct = rest.iter().position(|b| *b == b'/').and_then(|slash| {
                    let entry = &rest[slash + 1..];
                    (!entry.is_empty() && !entry.contains(&b'/')).then_some(&rest[..slash])
                });
                match direct {
                    Some(segment) => {
                        let key = std::str::from_utf8(segment)
                            .ok()
                            .map(super::names::unescape)
                            .filter(|k| {
                                k.starts_with(prefix) && crate::backend::key::validate(k).is_ok()
                            });
                        if let Some(key) = key
                            && keys.last() != Some(&key)
                        {
                            keys.push(key);
                        }
                        // Past the whole directory: `<root><segment>0`
                        // (`0` follows `/`).
                        let mut past = root.as_bytes().to_vec();
                        past.extend_from_slice(segment);
                        past.push(b'0');
                        next = Some(past);
                    }
                    None => {
                        let mut past = kv.key().to_vec();
                        past.push(0);
                        next = Some(past);
                    }
                }
                if keys.len() > crate::backend::holder::MAX_LISTED {
                    return Err(crate::backend::holder::too_many_to_list(
                        &self.shown,
                        prefix,
                    ));
                }
            }
            match next {
                Some(next) if page.kvs().len() as i64 >= LIST_PAGE => from = next,
                _ => return Ok(keys),
            }
        }
        Err(LockError::invalid_option(format!(
            "listing the {what} that start with `{prefix}` on {} read more than {} keys; list a longer prefix",
            self.shown,
            MAX_LIST_PAGES as i64 * LIST_PAGE
        )))
    }

    pub(super) async fn force_release_lock(&self, key: &str) -> Result<bool, LockError> {
        let Some(owner) = self.owner_of(key).await? else {
            return Ok(false);
        };
        let entry = owner.key().to_vec();
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.clone(),
                CompareOp::Equal,
                owner.create_revision(),
            )])
            .and_then([TxnOp::delete(entry, None)]);
        Ok(self.txn(txn).await?.succeeded())
    }
}
