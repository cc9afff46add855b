//! An operator's view of a lock key: the lock node with the lowest sequence
//! in the key's directory holds it; its data is the holder's owner token
//! (only its client name is shown), its `czxid` the fence. A forced release
//! deletes that node, which wakes the next node's watch.
//!
//! The time left: a lease is the holder's own (its local deadline, moved by
//! each renewal; the holder deletes its node when it passes), which the
//! server does not store. For a node this backend holds, the time left is
//! that deadline's, exactly as the holder's `LockGuard::remaining` says.
//! For another client's node a reader can see neither that deadline nor the
//! holder's session: the figure is then the longest the node can outlive
//! its holder, this client's session timeout (an upper bound).
//!
//! A listing reads the children of the prefix node `/<prefix>` (one key
//! directory each, a container that may outlive its last lock node for a
//! while), keeps the keys that start with the listing's prefix and inspects
//! each: an empty directory is a free key.

use std::time::Instant;

use zookeeper_client::Error as ZkError;

use super::order::sequence_of;
use super::{fence_of, lock, ZooKeeperBackend};
use crate::{LockError, LockInfo};

impl ZooKeeperBackend {
    /// The path of the node that holds the lock `key`, if any.
    async fn owner_of(&self, key: &str) -> Result<Option<String>, LockError> {
        let dir = self.lock_path(key)?;
        let session = self.session().await?;
        let children = match session.client.list_children(&dir).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.error(format_args!("cannot list {dir}"), e)),
        };
        Ok(children
            .iter()
            .filter_map(|c| Some((sequence_of(c)?, c)))
            .min_by_key(|(seq, _)| *seq)
            .map(|(_, c)| format!("{dir}/{c}")))
    }

    pub(super) async fn inspect_lock(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let Some(path) = self.owner_of(key).await? else {
            return Ok(None);
        };
        let session = self.session().await?;
        let (data, stat) = match session.client.get_data(&path).await {
            Ok(found) => found,
            // Released between the reads.
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.error(format_args!("cannot read {path}"), e)),
        };
        let holder = std::str::from_utf8(&data)
            .ok()
            .and_then(crate::backend::holder::holder_of)
            .map(str::to_owned);
        let own_lease = lock(&self.held)
            .get(&path)
            .map(|held| held.valid_until.saturating_duration_since(Instant::now()));
        Ok(Some(LockInfo::new(
            own_lease.unwrap_or_else(|| session.client.session_timeout()),
            fence_of(&stat),
            holder,
        )))
    }

    /// The held lock keys that start with `prefix`, each inspected.
    pub(super) async fn list_locks(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, LockInfo)>, LockError> {
        let root = format!("/{}", self.config.prefix);
        let session = self.session().await?;
        let children = match session.client.list_children(&root).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(self.error(format_args!("cannot list {root}"), e)),
        };
        let mut keys: Vec<String> = children
            .iter()
            .filter_map(|name| super::config::unescape_key(name))
            .filter(|key| key.starts_with(prefix) && crate::backend::key::validate(key).is_ok())
            .collect();
        if keys.len() > crate::backend::holder::MAX_LISTED {
            return Err(crate::backend::holder::too_many_to_list(
                &crate::LockBackend::describe(self),
                prefix,
            ));
        }
        keys.sort();
        let mut held = Vec::new();
        for key in keys {
            if let Some(info) = self.inspect_lock(&key).await? {
                held.push((key, info));
            }
        }
        Ok(held)
    }

    pub(super) async fn force_release_lock(&self, key: &str) -> Result<bool, LockError> {
        let Some(path) = self.owner_of(key).await? else {
            return Ok(false);
        };
        let session = self.session().await?;
        match session.client.delete(&path, None).await {
            Ok(()) => Ok(true),
            Err(ZkError::NoNode) => Ok(false),
            Err(e) => Err(self.error(format_args!("cannot delete {path}"), e)),
        }
    }
}
