//! Leader election on ZooKeeper, in Apache Curator's `LeaderLatch` layout,
//! so that a Java `new LeaderLatch(curator, "/<prefix>-election/<name>",
//! id)` and dlock's `Election::new(name)` compete in one election.
//!
//! - A participant is the EPHEMERAL_SEQUENTIAL node
//!   `_c_<uuid>-latch-<seq>` (Curator's protected name and `latch-`) under
//!   `/<prefix>-election/<escaped name>`, whose data is the participant's
//!   id: dlock's value. It is taken, waited for (a watch on the next-lower
//!   `latch-` node), renewed and released by the lock's queue code
//!   (`queue.rs`, `order.rs`'s `Queue::Latch`).
//! - The leader is the participant with the lowest sequence (Curator's
//!   `checkLeadership`); the term is its node's `czxid`.
//! - `proclaim` sets the node's data. Curator's participants never change
//!   their id: a Java `getLeader()` reads the new value, but a latch whose
//!   watch on its predecessor (the leader) fires for that data change
//!   ignores it and does not watch again, so it misses the leader's later
//!   resignation until its connection resets. In an election shared with
//!   Curator latches, proclaim only while none waits ([`crate::guide::interop`] says so).
//! - A campaign first deletes the participant nodes its own session left
//!   behind and no longer uses (`stale.rs`): one would lead a queue nobody
//!   leads for the rest of the session.
//! - Observers hold a persistent recursive watch on the election's node
//!   (ZooKeeper 3.6+): a participant's create, delete or data change makes
//!   them read the leader again.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use zookeeper_client::{AddWatchMode, Error as ZkError, PersistentWatcher};

use super::order::{protected_sequence, Queue, LATCH_NAME};
use super::session::Session;
use super::stale::Campaigning;
use super::{config, lock, ZooKeeperBackend};
use crate::backend::{AcquireRequest, ElectionBackend, Leader, LeaderChange, LeaderChanges, Lease};
use crate::LockError;

/// How many times `leader()` reads again when the leader's node went
/// between the listing and the read of its data.
const LEADER_TRIES: usize = 4;

impl ZooKeeperBackend {
    /// The node under which the participants of the election `name`
    /// queue, relative to the URL's chroot: `/<prefix>-election/<escaped
    /// name>`. This is the path to give Curator's `LeaderLatch` (with the
    /// same chroot as namespace) to take part in the same election.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if `name` is not a valid name.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181").await?;
    /// // Java: new LeaderLatch(curator, "/dlock-election/scheduler", "node-b")
    /// assert_eq!(zk.election_path("scheduler")?, "/dlock-election/scheduler");
    /// # Ok(()) }
    /// ```
    pub fn election_path(&self, name: &str) -> Result<String, LockError> {
        crate::backend::key::validate(name)?;
        Ok(format!(
            "/{}-election/{}",
            self.config.prefix,
            config::escape_key(name)
        ))
    }

    /// The session of the held node `resource`, if this backend holds it.
    fn session_of(&self, resource: &str) -> Option<Arc<Session>> {
        lock(&self.held).get(resource).map(|h| h.session.clone())
    }
}

/// One observer's persistent watch of an election's node, on the session
/// it was set on (kept open by this).
struct Changes {
    _session: Arc<Session>,
    watcher: PersistentWatcher,
}

#[async_trait]
impl LeaderChanges for Changes {
    async fn changed(&mut self) -> LeaderChange {
        let event = self.watcher.changed().await;
        // ZooKeeper's events name a node, not its data: the caller reads.
        // A disconnection that the session survives keeps the watch (the
        // caller reads again: events may have been lost meanwhile); an
        // ended session ends it.
        if event.session_state.is_terminated() {
            LeaderChange::Closed
        } else {
            LeaderChange::Unknown
        }
    }
}

#[async_trait]
impl ElectionBackend for ZooKeeperBackend {
    fn own_layout(&self) -> bool {
        true
    }

    /// The lock's queue code with `latch-` nodes. A lock node's data is
    /// its owner token and a participant's is its id, so the node is
    /// created from a request that carries the value where a lock's
    /// carries the token; the lease gets the owner token back.
    async fn campaign(
        &self,
        req: &AcquireRequest,
        value: &str,
        deadline: Option<Instant>,
        once: bool,
    ) -> Result<Option<Lease>, LockError> {
        let dir = self.election_path(&req.key)?;
        let participant = AcquireRequest {
            key: req.key.clone(),
            token: value.to_owned(),
            ttl: req.ttl,
        };
        let queue = (dir.as_str(), Queue::Latch);
        // A node this session left behind would be ahead of ours, and of
        // everyone's, for as long as the session lives: gone first.
        let campaigning = Campaigning::begin(&self.campaigns, &dir);
        self.sweep_own_stale(&dir, &campaigning, deadline).await;
        let lease = if once {
            self.try_queued(&participant, queue).await?
        } else {
            self.acquire_queued(&participant, queue, deadline).await?
        };
        Ok(lease.map(|lease| Lease {
            token: req.token.clone(),
            ..lease
        }))
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool, LockError> {
        let Some(session) = self.session_of(&lease.resource) else {
            return Ok(false);
        };
        match session
            .client
            .set_data(&lease.resource, value.as_bytes(), None)
            .await
        {
            Ok(stat) => Ok(stat.ephemeral_owner == session.client.session_id().0),
            Err(ZkError::NoNode) => Ok(false),
            Err(e) => Err(self.error(format_args!("cannot set the data of {}", lease.resource), e)),
        }
    }

    /// Nothing: the release deletes the participant's node, which is what
    /// observers (and Curator's latches) see.
    async fn withdraw(&self, _lease: &Lease) -> Result<(), LockError> {
        Ok(())
    }

    async fn leader(&self, name: &str) -> Result<Option<Leader>, LockError> {
        let dir = self.election_path(name)?;
        let session = self.session().await?;
        let client = &session.client;
        for _ in 0..LEADER_TRIES {
            let children = match client.list_children(&dir).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => return Ok(None),
                Err(e) => return Err(self.error(format_args!("cannot list {dir}"), e)),
            };
            let first = children
                .iter()
                .filter_map(|c| Some((protected_sequence(c, LATCH_NAME)?, c)))
                .min_by_key(|(seq, _)| *seq);
            let Some((_, first)) = first else {
                return Ok(None);
            };
            match client.get_data(&format!("{dir}/{first}")).await {
                Ok((data, stat)) => {
                    return Ok(Some(Leader {
                        value: String::from_utf8_lossy(&data).into_owned(),
                        term: u64::try_from(stat.czxid).unwrap_or(0),
                    }))
                }
                // Gone since the listing: list again.
                Err(ZkError::NoNode) => continue,
                Err(e) => return Err(self.error(format_args!("cannot read {dir}/{first}"), e)),
            }
        }
        Err(LockError::backend(
            self.shown.clone(),
            format!("the leader of {dir} changed under every one of {LEADER_TRIES} reads"),
        ))
    }

    async fn watch(&self, name: &str) -> Result<Box<dyn LeaderChanges>, LockError> {
        let dir = self.election_path(name)?;
        let session = self.session().await?;
        let watcher = session
            .client
            .watch(&dir, AddWatchMode::PersistentRecursive)
            .await
            .map_err(|e| self.error(format_args!("cannot watch {dir}"), e))?;
        Ok(Box::new(Changes {
            _session: session,
            watcher,
        }))
    }
}
