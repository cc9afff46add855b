//! A campaign's sweep of its own session's stale participant nodes.
//!
//! A participant node is ephemeral: it lives as long as the session that
//! created it, whoever still uses it. A leader whose leadership was lost
//! (stalled past its ttl, then resumed) gives its node up, in the
//! background when the delete cannot be sent at once; if that delete never
//! lands, the node stays for the rest of the session, with the lowest
//! sequence of the election: every candidate waits behind it, the process
//! that left it too, and nobody leads again until the session ends (issue
//! 41 saw 30–45 s, until the processes were killed).
//!
//! So before it takes a place, a campaign deletes every `latch-` node of
//! the election that its own session owns (the node's `ephemeralOwner` is
//! the session id) and that this backend no longer uses: not a held
//! leadership, and no other campaign of the same election in flight on
//! this backend (whose node it could be). The sweep costs one listing and
//! one pipelined round of `exists`, and only campaigns pay it: an election
//! changes hands rarely. A lock's acquisition does not sweep (its node is
//! on the hot path of every critical section); it relies, as the campaign
//! does first, on deletes that retry until they land or the session ends
//! (`cleanup.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zookeeper_client::Error as ZkError;

use super::order::{protected_sequence, LATCH_NAME};
use super::queue::retrying;
use super::session::Session;
use super::{lock, ZooKeeperBackend};

/// The longest a campaign spends on its sweep before it campaigns anyway
/// (a server slow to answer; a connection being re-established).
const SWEEP_LIMIT: Duration = Duration::from_secs(2);

/// How many campaigns of each election (by directory) are in flight on a
/// backend.
pub(super) type Campaigns = Arc<Mutex<HashMap<String, usize>>>;

/// One campaign in flight on an election's directory; counted while it
/// lives, so that a concurrent campaign's sweep spares its node (dropped
/// when the campaign ends, cancelled or not).
pub(super) struct Campaigning {
    campaigns: Campaigns,
    dir: String,
}

impl Campaigning {
    /// Counted before the campaign sends anything, so before its create.
    pub(super) fn begin(campaigns: &Campaigns, dir: &str) -> Self {
        *lock(campaigns).entry(dir.to_owned()).or_insert(0) += 1;
        Campaigning {
            campaigns: campaigns.clone(),
            dir: dir.to_owned(),
        }
    }

    /// Whether it is the only campaign of its directory in flight now.
    fn alone(&self) -> bool {
        lock(&self.campaigns).get(&self.dir).copied() == Some(1)
    }
}

impl Drop for Campaigning {
    fn drop(&mut self) {
        let mut counts = lock(&self.campaigns);
        if let Some(count) = counts.get_mut(&self.dir) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.dir);
            }
        }
    }
}

impl ZooKeeperBackend {
    /// Deletes the participant nodes under `dir` that the current session
    /// owns and this backend no longer uses (see the module docs); nothing
    /// when another campaign of `dir` runs on this backend, or no session
    /// is open (a new one owns no node). Best effort, within
    /// [`SWEEP_LIMIT`] and `deadline`: a failure is logged, and the
    /// campaign goes on (it fails by itself if the server is unreachable).
    pub(super) async fn sweep_own_stale(
        &self,
        dir: &str,
        campaign: &Campaigning,
        deadline: Option<Instant>,
    ) {
        let Some(session) = self.usable_session() else {
            return;
        };
        let limit = deadline.map_or(SWEEP_LIMIT, |d| {
            d.saturating_duration_since(Instant::now()).min(SWEEP_LIMIT)
        });
        match tokio::time::timeout(limit, self.sweep(&session, dir, campaign)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(%dir, error = %e, "could not sweep own stale participant nodes");
            }
            Err(_) => {
                tracing::debug!(%dir, "sweeping own stale participant nodes took over {limit:?}; campaigning anyway");
            }
        }
    }

    async fn sweep(
        &self,
        session: &Arc<Session>,
        dir: &str,
        campaign: &Campaigning,
    ) -> Result<(), ZkError> {
        let client = &session.client;
        let children = match retrying(client, || client.list_children(dir)).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(()),
            Err(e) => return Err(e),
        };
        // Decided after the listing: a campaign of this backend that began
        // before now and is still in flight may own a listed node, so
        // nothing is swept then; one that began later created its node
        // after the listing; one that ended holds its node (`held`) or
        // left it behind, stale.
        if !campaign.alone() {
            return Ok(());
        }
        let unused: Vec<String> = {
            let held = lock(&self.held);
            children
                .iter()
                .filter(|c| protected_sequence(c, LATCH_NAME).is_some())
                .map(|c| format!("{dir}/{c}"))
                .filter(|path| !held.contains_key(path))
                .collect()
        };
        // Sent together, answered in order: one round trip.
        let stats: Vec<_> = unused.iter().map(|path| client.check_stat(path)).collect();
        let own = client.session_id().0;
        for (path, stat) in unused.iter().zip(stats) {
            match stat.await? {
                Some(stat) if stat.ephemeral_owner == own => {
                    tracing::info!(%path, "deleting a participant node this session left behind");
                    match client.delete(path, None).await {
                        Ok(()) | Err(ZkError::NoNode) => {}
                        Err(e) => return Err(e),
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}
