//! Semaphores on ZooKeeper: the first N sequential nodes under the
//! semaphore's path hold its permits (Curator's `InterProcessSemaphoreV2`
//! idea).
//!
//! - A contender creates the EPHEMERAL_SEQUENTIAL node
//!   `/<prefix>-semaphores/<escaped name>/_c_<uuid>-lock-<seq>` with the
//!   protected create of locks (found again by uuid if the answer is lost).
//!   The `-semaphores` root keeps semaphores apart from lock paths.
//! - It holds a permit while fewer than N children have a smaller sequence;
//!   otherwise it waits on a children watch (any release may free a place,
//!   so there is no single predecessor to watch) and looks again.
//! - A dropped or timed-out acquisition deletes its node in the background,
//!   as a lock's `try_acquire` does; the session's end removes it anyway.
//! - A create that meets a session expired unknown to the client starts
//!   over once on a new session, as a lock's acquisition does.
//! - Renewal and release are those of lock nodes: a read of the node on its
//!   session, and a delete.

use std::time::Instant;

use async_trait::async_trait;

use super::cleanup::Cleanup;
use super::order::{sequence_of, LOCK_NAME};
use super::queue::new_uuid;
use super::{after_sync, config, is_connected, representable, ZooKeeperBackend};
use crate::backend::{AcquireRequest, Lease, PermitBackend, PermitRequest, Renewal};
use crate::{deadline, LockError};

/// Whether fewer than `permits` of `children` have a smaller sequence than `own`.
fn among_first(children: &[String], own: &str, permits: usize) -> bool {
    let Some(mine) = sequence_of(own) else {
        return false;
    };
    children
        .iter()
        .filter_map(|c| sequence_of(c))
        .filter(|seq| *seq < mine)
        .count()
        < permits
}

impl ZooKeeperBackend {
    /// `/<prefix>-semaphores/<escaped name>`: the node under which the
    /// semaphore `name`'s contenders queue, apart from lock paths.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if `name` is not a valid key.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181").await?;
    /// assert_eq!(zk.semaphore_path("exports")?, "/dlock-semaphores/exports");
    /// # Ok(()) }
    /// ```
    pub fn semaphore_path(&self, name: &str) -> Result<String, LockError> {
        crate::key::validate(name)?;
        Ok(format!(
            "/{}-semaphores/{}",
            self.config.prefix,
            config::escape_key(name)
        ))
    }

    /// Takes a permit: create our node, and unless `once`, wait until fewer
    /// than `req.permits` nodes are ahead of it. The caller bounds this by its
    /// deadline; dropping it deletes our node in the background.
    pub(super) async fn permit(
        &self,
        req: &PermitRequest,
        once: bool,
    ) -> Result<Option<Lease>, LockError> {
        let dir = self.semaphore_path(&req.name)?;
        let uuid = new_uuid()?;
        // As for a lock (`acquire_queued`): a create that fails because the
        // session expired unknown to this client took nothing, so the
        // acquisition starts over, once, on a new session.
        let mut started_over = false;
        let (session, mut cleanup, created) = loop {
            let session = self.session().await?;
            let state = session.client.state();
            if once && !is_connected(state) {
                // One attempt must not wait for a reconnect.
                return Err(LockError::backend(
                    self.shown.clone(),
                    format!("ZooKeeper is unreachable (session {state})"),
                ));
            }
            // Armed before the create: dropped at any await, the node goes.
            let mut cleanup = Cleanup::new(&session, &dir, &uuid);
            let created = self
                .create_protected(
                    &session.client,
                    &dir,
                    (&uuid, LOCK_NAME),
                    req.token.as_bytes(),
                    false,
                )
                .await;
            match created {
                Ok(created) => break (session, cleanup, created),
                Err(_) if !started_over && session.client.state().is_terminated() => {
                    // Its node, if the create landed, went with the session.
                    cleanup.disarm();
                    started_over = true;
                }
                Err(e) => return Err(e),
            }
        };
        let client = &session.client;
        let (path, stat) = (created.path, created.stat);
        cleanup.set_path(&path);
        let name = path[dir.len() + 1..].to_owned();
        let as_lock = AcquireRequest {
            key: req.name.clone(),
            token: req.token.clone(),
            ttl: req.ttl,
        };
        loop {
            // The listing, behind a sync, proves the session alive on the
            // leader when it was sent: the lease starts then.
            let sent = Instant::now();
            let (children, watcher) = after_sync(client, || client.list_and_watch_children(&dir))
                .await
                .map_err(|e| self.error(format_args!("cannot list {dir}"), e))?;
            let listed = (sent, Instant::now());
            if !children.contains(&name) {
                cleanup.disarm();
                return Err(LockError::backend(
                    self.shown.clone(),
                    format!("permit node {path} vanished while waiting (session expired, or deleted by someone)"),
                ));
            }
            if among_first(&children, &name, req.permits) {
                let lease = self.lease(&as_lock, client, &path, &stat, listed)?;
                self.remember(&lease, &session, cleanup);
                return Ok(Some(lease));
            }
            if once {
                // Leave now, so our node does not hold a place in the queue.
                return match cleanup.leave().await {
                    Ok(()) => Ok(None),
                    Err(e) => {
                        Err(self.error(format_args!("cannot delete own permit node {path}"), e))
                    }
                };
            }
            watcher.changed().await;
        }
    }
}

#[async_trait]
impl PermitBackend for ZooKeeperBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let once = self.permit(req, true);
        let limit = self
            .session_timeout()
            .max(std::time::Duration::from_secs(1));
        match tokio::time::timeout(limit, once).await {
            Ok(answer) => answer,
            Err(_) => Err(LockError::backend(
                self.shown.clone(),
                format!("ZooKeeper did not answer within {limit:?}"),
            )),
        }
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        // Dropping the wait at the deadline deletes our node (`Cleanup`).
        deadline::until(representable(deadline), self.permit(req, false))
            .await
            .unwrap_or(Ok(None))
    }

    /// Permit nodes are session nodes like lock nodes: the same read.
    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_nodes(leases).await
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        self.release_node(lease).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_n_sequences_hold_permits() {
        let children: Vec<String> = [3, 1, 2, 5]
            .iter()
            .map(|s| format!("_c_00000000-0000-4000-8000-{s:012}-lock-{s:010}"))
            .collect();
        assert!(among_first(&children, &children[1], 2)); // seq 1
        assert!(among_first(&children, &children[2], 2)); // seq 2
        assert!(!among_first(&children, &children[0], 2)); // seq 3: two ahead
        assert!(among_first(&children, &children[0], 3));
    }
}
