//! An operator's view of a lock key: the oldest direct entry of the key's
//! directory holds it; its value is the holder's client name (empty for an
//! `etcdctl lock` holder), its create revision the fence, its lease's time
//! to live the time left. A forced release deletes that entry (compared by
//! its create revision), which wakes the next entry's watch.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};

use super::contenders::{Contenders, PAGE};
use super::Inner;
use crate::{LockError, LockInfo};

/// The most pages read for an owner among deeper keys.
const MAX_PAGES: usize = 64;

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
