//! What an operator reads of a semaphore on ZooKeeper: the holding nodes'
//! data (each holder's token, so its client name) and the count in the
//! semaphore node's data; the semaphores are the children of
//! `/<prefix>-semaphores`.

use zookeeper_client::Error as ZkError;

use super::permits::holding;
use super::{config, ZooKeeperBackend};
use crate::backend::holder::holder_of;
use crate::backend::{PermitHolder, SemaphoreInfo};
use crate::LockError;

impl ZooKeeperBackend {
    /// The holders of `name` (one read of each holding node) and the count
    /// its node stores; nothing while it has no contender.
    pub(super) async fn inspect_permits(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let dir = self.semaphore_path(name)?;
        let session = self.session().await?;
        let client = &session.client;
        let children = match client.list_children(&dir).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(SemaphoreInfo::new(None, Vec::new())),
            Err(e) => return Err(self.error(format_args!("cannot list {dir}"), e)),
        };
        let data = match client.get_data(&dir).await {
            Ok((data, _)) => data,
            Err(ZkError::NoNode) => return Ok(SemaphoreInfo::new(None, Vec::new())),
            Err(e) => return Err(self.error(format_args!("cannot read {dir}"), e)),
        };
        let stored = std::str::from_utf8(&data)
            .ok()
            .and_then(|d| d.parse::<usize>().ok());
        let Some(stored) = stored else {
            return Ok(SemaphoreInfo::new(None, Vec::new()));
        };
        let mut holders = Vec::new();
        for (child, count) in holding(&children, stored) {
            let path = format!("{dir}/{child}");
            let token = match client.get_data(&path).await {
                Ok((token, _)) => token,
                // Released between the listing and this read.
                Err(ZkError::NoNode) => continue,
                Err(e) => return Err(self.error(format_args!("cannot read {path}"), e)),
            };
            let token = String::from_utf8_lossy(&token);
            holders.push(PermitHolder::new(
                holder_of(&token).map(str::to_owned),
                None,
                count,
            ));
        }
        let permits = (!holders.is_empty()).then_some(stored);
        Ok(SemaphoreInfo::new(permits, holders))
    }

    /// The semaphores whose names start with `prefix`: the children of
    /// `/<prefix>-semaphores` (a node stays until the server's container
    /// clean-up removes it, so some may have no holder).
    pub(super) async fn permit_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let root = format!("/{}-semaphores", self.config.prefix);
        let session = self.session().await?;
        let children = match session.client.list_children(&root).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(self.error(format_args!("cannot list {root}"), e)),
        };
        Ok(children
            .iter()
            .filter_map(|child| config::unescape_key(child))
            .filter(|name| name.starts_with(prefix) && crate::backend::key::validate(name).is_ok())
            .collect())
    }
}
