//! Semaphores on ZooKeeper: the first N sequential nodes under the
//! semaphore's path hold its permits (Curator's `InterProcessSemaphoreV2`
//! idea).
//!
//! - A contender creates the EPHEMERAL_SEQUENTIAL node
//!   `/<prefix>-semaphores/<escaped name>/_c_<uuid>-lock-<seq>` with the
//!   protected create of locks (found again by uuid if the answer is lost).
//!   The `-semaphores` root keeps semaphores apart from lock paths.
//! - `acquire_many(n)` names its node `_c_<uuid>-w<n>-lock-<seq>` (a node
//!   of one permit keeps Curator's name). A node holds while the permits
//!   of the nodes with a smaller sequence (held or waiting) and its own fit
//!   in N, so nobody passes a waiting taker of n.
//! - It holds a permit while the nodes ahead of it leave room (above);
//!   otherwise it waits on a children watch (any release may free a place,
//!   so there is no single predecessor to watch) and looks again.
//! - A dropped or timed-out acquisition deletes its node in the background,
//!   as a lock's `try_acquire` does; the session's end removes it anyway.
//! - A create that meets a session expired unknown to the client starts
//!   over once on a new session, as a lock's acquisition does.
//! - Renewal and release are those of lock nodes: a read of the node on its
//!   session, and a delete.
//! - The permit count is the data of the semaphore's node (a container):
//!   once our node is in it (so the directory cannot go), the first
//!   contender to find it empty writes its count (a compare-and-set on the
//!   node's version); the others compare theirs. Another count is refused
//!   ([`permit_count_differs`]) unless the directory turns out empty once
//!   our node has left: then nobody holds a permit, the directory is
//!   deleted (a delete refused while any node is in it), and the
//!   acquisition starts over in a new one with this caller's count. The
//!   count lives as long as the directory: until its last node goes, and
//!   then until the next caller with another count, or the server's
//!   container clean-up, removes it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use async_trait::async_trait;

use super::cleanup::Cleanup;
use super::order::{protected_sequence, sequence_of, LOCK_NAME};
use super::queue::{new_uuid, retrying};
use super::{after_sync, config, is_connected, representable, ZooKeeperBackend};
use crate::backend::{
    permit_count_differs, AcquireRequest, Lease, PermitBackend, PermitRequest, Renewal,
};
use crate::{backend::deadline, LockError};
use zookeeper_client::Error as ZkError;

/// A contender's sequence and how many permits it takes:
/// `_c_<uuid>-lock-<seq>` (Curator's name) takes 1, `_c_<uuid>-w<n>-lock-<seq>`
/// (`acquire_many(n)`) takes n. `None` for a child of any other form.
fn contender(child: &str) -> Option<(i64, usize)> {
    if let Some(seq) = sequence_of(child) {
        return Some((seq, 1));
    }
    let weighted = child.strip_prefix("_c_")?.get(37..)?.strip_prefix('w')?;
    let (n, _) = weighted.split_once('-')?;
    let count: usize = n.parse().ok()?;
    let seq = protected_sequence(child, &node_kind(count))?;
    Some((seq, count.max(1)))
}

/// The name part of a contender node taking `count` permits (see [`contender`]).
fn node_kind(count: usize) -> String {
    if count == 1 {
        LOCK_NAME.to_owned()
    } else {
        format!("w{count}-{LOCK_NAME}")
    }
}

/// Whether `own` holds: the permits taken by the contenders with a smaller
/// sequence, and its own, fit in `permits`. Contenders ahead count whether
/// they hold or wait, so a waiting taker of 4 stops later takers of 1.
fn among_first(children: &[String], own: &str, permits: usize) -> bool {
    let Some((mine, count)) = contender(own) else {
        return false;
    };
    let ahead: usize = children
        .iter()
        .filter_map(|c| contender(c))
        .filter(|(seq, _)| *seq < mine)
        .map(|(_, n)| n)
        .sum();
    ahead.saturating_add(count) <= permits
}

/// How many permits the holders among `children` take: the contenders in
/// sequence order while their counts fit in `permits`.
fn held_weight(children: &[String], permits: usize) -> usize {
    holding(children, permits).iter().map(|(_, n)| n).sum()
}

/// The children that hold permits, with how many each: the first run, by
/// sequence, whose counts fit in `permits` (see [`held_weight`]).
pub(super) fn holding(children: &[String], permits: usize) -> Vec<(&String, usize)> {
    let mut line: Vec<(i64, usize, &String)> = children
        .iter()
        .filter_map(|c| contender(c).map(|(seq, n)| (seq, n, c)))
        .collect();
    line.sort_unstable();
    let mut held = 0usize;
    let mut holders = Vec::new();
    for (_, n, child) in line {
        if held.saturating_add(n) > permits {
            break;
        }
        held += n;
        holders.push((child, n));
    }
    holders
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
        crate::backend::key::validate(name)?;
        Ok(format!(
            "/{}-semaphores/{}",
            self.config.prefix,
            config::escape_key(name)
        ))
    }

    /// Takes a permit: create our node, and unless `once`, wait until fewer
    /// than `req.permits` nodes are ahead of it. The caller bounds this by its
    /// deadline; dropping it deletes our node in the background. A count
    /// other than the directory's is refused, unless the directory was
    /// empty: then it is deleted and this starts over, once.
    pub(super) async fn permit(
        &self,
        req: &PermitRequest,
        once: bool,
        watching: &AtomicBool,
    ) -> Result<Option<Lease>, LockError> {
        let mut stored = 0;
        for _ in 0..2 {
            match self.permit_counted(req, once, watching).await? {
                Counted::Done(lease) => return Ok(lease),
                Counted::Cleared(count) => stored = count,
            }
        }
        Err(permit_count_differs(&req.name, stored, req.permits))
    }

    /// The semaphore directory `dir`'s permit count, written with
    /// `permits` if it has none yet: `None` if it is `permits`, else the
    /// other count. Our node must be in `dir` (so `dir` cannot be deleted
    /// meanwhile).
    async fn agree_on_count(
        &self,
        client: &zookeeper_client::Client,
        dir: &str,
        permits: usize,
    ) -> Result<Option<usize>, LockError> {
        let ours = permits.to_string();
        // Each turn either ends or sees a write of the count by another
        // contender, after which the count is there: two turns suffice.
        for _ in 0..3 {
            let (data, stat) = retrying(client, || client.get_data(dir))
                .await
                .map_err(|e| self.error(format_args!("cannot read {dir}"), e))?;
            if data.is_empty() {
                // A set whose answer was lost and is sent again meets
                // BadVersion, and the next turn reads our count.
                let set = retrying(client, || {
                    client.set_data(dir, ours.as_bytes(), Some(stat.version))
                })
                .await;
                match set {
                    Ok(_) => return Ok(None),
                    Err(ZkError::BadVersion) => continue,
                    Err(e) => {
                        return Err(
                            self.error(format_args!("cannot write the permit count into {dir}"), e)
                        )
                    }
                }
            }
            let stored = std::str::from_utf8(&data)
                .ok()
                .and_then(|text| text.parse::<usize>().ok())
                .ok_or_else(|| {
                    LockError::backend(
                        self.shown.clone(),
                        format!(
                            "the semaphore node {dir} holds data dlock did not write ({} bytes); is another program using the `-semaphores` root?",
                            data.len()
                        ),
                    )
                })?;
            return Ok((stored != permits).then_some(stored));
        }
        Err(LockError::backend(
            self.shown.clone(),
            format!("the permit count of {dir} kept changing; try again"),
        ))
    }

    /// [`permit`](Self::permit) once.
    async fn permit_counted(
        &self,
        req: &PermitRequest,
        once: bool,
        watching: &AtomicBool,
    ) -> Result<Counted, LockError> {
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
                    crate::backend::transient::Transient::new(format!(
                        "ZooKeeper is unreachable (session {state})"
                    )),
                ));
            }
            // Armed before the create: dropped at any await, the node goes.
            let mut cleanup = Cleanup::new(&session, &dir, &uuid);
            let created = self
                .create_protected(
                    &session.client,
                    &dir,
                    (&uuid, &node_kind(req.count)),
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
        if let Some(stored) = self.agree_on_count(client, &dir, req.permits).await? {
            cleanup
                .leave()
                .await
                .map_err(|e| self.error(format_args!("cannot delete own permit node {path}"), e))?;
            // Refused while any node is in it: a holder, or a contender
            // (which compares its count as we did).
            return match client.delete(&dir, None).await {
                Ok(()) | Err(ZkError::NoNode) => Ok(Counted::Cleared(stored)),
                Err(ZkError::NotEmpty) => Err(permit_count_differs(&req.name, stored, req.permits)),
                Err(e) => Err(self.error(format_args!("cannot delete the empty {dir}"), e)),
            };
        }
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
                return Ok(Counted::Done(Some(lease)));
            }
            if once {
                // Leave now, so our node does not hold a place in the queue.
                return match cleanup.leave().await {
                    Ok(()) => Ok(Counted::Done(None)),
                    Err(e) => {
                        Err(self.error(format_args!("cannot delete own permit node {path}"), e))
                    }
                };
            }
            // Nothing asked while it waits for a release (what the caller
            // reads if its deadline comes now).
            watching.store(true, Ordering::Relaxed);
            watcher.changed().await;
            watching.store(false, Ordering::Relaxed);
        }
    }
}

/// How one [`ZooKeeperBackend::permit_counted`] ended.
enum Counted {
    /// A permit, or none free (`once`).
    Done(Option<Lease>),
    /// Another count was stored in an empty directory, now deleted: try
    /// again. Carries that count.
    Cleared(usize),
}

#[async_trait]
impl PermitBackend for ZooKeeperBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let not_waiting = AtomicBool::new(false);
        let once = self.permit(req, true, &not_waiting);
        let limit = self
            .session_timeout()
            .max(std::time::Duration::from_secs(1));
        match tokio::time::timeout(limit, once).await {
            Ok(answer) => answer,
            Err(_) => Err(LockError::backend(
                self.shown.clone(),
                crate::backend::transient::Transient::new(format!(
                    "ZooKeeper did not answer within {limit:?}"
                )),
            )),
        }
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        // Dropping the wait at the deadline deletes our node (`Cleanup`).
        let watching = AtomicBool::new(false);
        let waited = self.permit(req, false, &watching);
        match deadline::until(representable(deadline), waited).await {
            Some(answer) => answer,
            // Waiting for a release: the permits are taken.
            None if watching.load(Ordering::Relaxed) => Ok(None),
            // A request was in flight: a timeout only if the server is there.
            None if self.answers_now().await => Ok(None),
            None => Err(super::lock_node::silent_at_deadline(&self.shown)),
        }
    }

    /// Permit nodes are session nodes like lock nodes: the same read.
    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_nodes(leases).await
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        self.release_node(lease).await
    }

    fn many_permits(&self) -> bool {
        true
    }

    async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        let dir = self.semaphore_path(name)?;
        let session = self.session().await?;
        let client = &session.client;
        let children = match client.list_children(&dir).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(permits),
            Err(e) => return Err(self.error(format_args!("cannot list {dir}"), e)),
        };
        let holding = children.iter().any(|c| contender(c).is_some());
        if holding {
            let (data, _) = match client.get_data(&dir).await {
                Ok(answer) => answer,
                Err(ZkError::NoNode) => return Ok(permits),
                Err(e) => return Err(self.error(format_args!("cannot read {dir}"), e)),
            };
            let stored = std::str::from_utf8(&data)
                .ok()
                .and_then(|d| d.parse::<usize>().ok());
            if let Some(stored) = stored.filter(|stored| *stored != permits) {
                return Err(permit_count_differs(name, stored, permits));
            }
        }
        Ok(permits.saturating_sub(held_weight(&children, permits)))
    }

    async fn inspect_semaphore(
        &self,
        name: &str,
    ) -> Result<crate::backend::SemaphoreInfo, LockError> {
        self.inspect_permits(name).await
    }

    async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.permit_names(prefix).await
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

    #[test]
    fn a_weighted_contender_counts_its_permits_and_stops_those_behind() {
        let node = |s: i64, n: usize| {
            format!("_c_00000000-0000-4000-8000-{s:012}-{}{s:010}", node_kind(n))
        };
        let children = vec![node(1, 1), node(2, 4), node(3, 1)];
        assert_eq!(contender(&children[1]), Some((2, 4)));
        assert!(among_first(&children, &children[0], 4));
        assert!(!among_first(&children, &children[1], 4), "1 + 4 > 4");
        assert!(
            !among_first(&children, &children[2], 4),
            "behind the taker of 4"
        );
        assert_eq!(held_weight(&children, 4), 1);
        assert_eq!(held_weight(&children, 6), 6);
    }
}
