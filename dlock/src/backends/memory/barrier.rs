//! The double barriers of the in-process backend: per name, the members
//! with server-side deadlines, whether the barrier is open, and the round
//! (how many times it emptied), behind a watch that wakes every waiter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::watch;

use super::ticket::lock_table;
use super::MemoryBackend;
use crate::backend::deadline::saturating_add;
use crate::backend::{lease_deadline, BarrierBackend, BarrierRequest, Lease, Renewal};
use crate::LockError;

/// Every barrier of one `MemoryBackend`.
#[derive(Debug, Default)]
pub(super) struct BarrierTable {
    state: Mutex<HashMap<String, BarrierState>>,
    rounds: AtomicU64,
}

#[derive(Debug)]
struct BarrierState {
    /// Member token → server-side expiry.
    members: HashMap<String, Instant>,
    /// Set when `parties` members were in; cleared when the last one goes.
    open: bool,
    /// The current round, changed each time the barrier empties (from one
    /// counter of the table, so a name forgotten and used again starts a
    /// round no earlier member was in): a member whose `leave` finds
    /// another round than its own has seen everyone of its round leave.
    round: u64,
    /// Bumped on every change; waiters subscribe before they look.
    changed: watch::Sender<u64>,
}

impl BarrierState {
    fn new(round: u64) -> Self {
        BarrierState {
            members: HashMap::new(),
            open: false,
            round,
            changed: watch::Sender::new(0),
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Counts out the members whose lease ran out, as a server's expiry would.
    fn expire(&mut self, now: Instant, rounds: &AtomicU64) {
        let before = self.members.len();
        self.members.retain(|_, expires| *expires > now);
        if self.members.len() < before {
            self.after_removal(rounds);
        }
    }

    /// Closes the barrier once its last member is gone (the next members
    /// are a new round), and wakes everyone.
    fn after_removal(&mut self, rounds: &AtomicU64) {
        if self.members.is_empty() {
            self.open = false;
            self.round = rounds.fetch_add(1, Ordering::Relaxed);
        }
        self.bump();
    }

    fn earliest_expiry(&self) -> Option<Instant> {
        self.members.values().min().copied()
    }
}

/// The member's lease resource: the barrier and the round it entered.
fn resource(name: &str, round: u64) -> String {
    format!("barrier:{name}#{round}")
}

fn round_of(resource: &str) -> u64 {
    resource
        .rsplit_once('#')
        .and_then(|(_, r)| r.parse().ok())
        .unwrap_or(0)
}

/// Removes a member whose `enter` ended without handing it over (timed
/// out, cancelled), so it never counts towards `parties`.
struct Entering<'a> {
    table: &'a BarrierTable,
    name: &'a str,
    token: &'a str,
    armed: bool,
}

impl Drop for Entering<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.table.remove(self.name, self.token);
        }
    }
}

impl BarrierTable {
    /// Removes `token` from `name`: whether it was there.
    fn remove(&self, name: &str, token: &str) -> bool {
        let mut table = lock_table(&self.state);
        let Some(entry) = table.get_mut(name) else {
            return false;
        };
        let was = entry.members.remove(token).is_some();
        if was {
            entry.after_removal(&self.rounds);
        }
        if entry.members.is_empty() && entry.changed.receiver_count() == 0 {
            table.remove(name);
        }
        was
    }

    async fn enter(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let mut entering = Entering {
            table: self,
            name: &req.name,
            token: &req.token,
            armed: true,
        };
        // Our own member is renewed here while we wait (the watchdog takes
        // over once `enter` returns): every third of the ttl at least.
        let refresh = req.ttl / 3;
        loop {
            let now = Instant::now();
            let (mut changed, wake) = {
                let mut table = lock_table(&self.state);
                let entry = table.entry(req.name.clone()).or_insert_with(|| {
                    BarrierState::new(self.rounds.fetch_add(1, Ordering::Relaxed))
                });
                entry.expire(now, &self.rounds);
                let added = entry
                    .members
                    .insert(req.token.clone(), lease_deadline(now, req.ttl))
                    .is_none();
                if entry.open || entry.members.len() >= req.parties {
                    if !entry.open || added {
                        entry.open = true;
                        entry.bump();
                    }
                    entering.armed = false;
                    return Ok(Some(Lease {
                        key: req.name.clone(),
                        token: req.token.clone(),
                        ttl: req.ttl,
                        fencing_token: None,
                        valid_until: lease_deadline(now, req.ttl),
                        resource: resource(&req.name, entry.round),
                    }));
                }
                if added {
                    entry.bump();
                }
                let mut changed = entry.changed.subscribe();
                changed.mark_unchanged();
                let mut wake = saturating_add(now, refresh);
                if let Some(expiry) = entry.earliest_expiry() {
                    wake = wake.min(expiry);
                }
                (changed, wake)
            };
            if deadline.is_some_and(|d| now >= d) {
                // Dropping `entering` removes the member.
                return Ok(None);
            }
            let wake = deadline.map_or(wake, |d| wake.min(d));
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    async fn wait_all_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        let round = round_of(&member.resource);
        loop {
            let now = Instant::now();
            let (mut changed, wake) = {
                let mut table = lock_table(&self.state);
                let Some(entry) = table.get_mut(&member.key) else {
                    return Ok(true);
                };
                entry.expire(now, &self.rounds);
                if entry.round != round || entry.members.is_empty() {
                    return Ok(true);
                }
                let mut changed = entry.changed.subscribe();
                changed.mark_unchanged();
                (changed, entry.earliest_expiry())
            };
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            let wake = match (wake, deadline) {
                (Some(w), Some(d)) => Some(w.min(d)),
                (w, d) => w.or(d),
            };
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changed.changed() => {}
                () = sleep => {}
            }
        }
    }

    fn renew(&self, lease: &Lease) -> Result<Renewal, LockError> {
        let now = Instant::now();
        let mut table = lock_table(&self.state);
        let Some(entry) = table.get_mut(&lease.key) else {
            return Ok(Renewal::Deleted);
        };
        entry.expire(now, &self.rounds);
        match entry.members.get_mut(&lease.token) {
            Some(expires) => {
                *expires = lease_deadline(now, lease.ttl);
                Ok(Renewal::Renewed {
                    valid_until: *expires,
                })
            }
            None => Ok(Renewal::Deleted),
        }
    }
}

#[async_trait]
impl BarrierBackend for MemoryBackend {
    async fn enter_barrier(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.barriers.enter(req, deadline).await
    }

    async fn wait_all_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        self.barriers.wait_all_left(member, deadline).await
    }

    async fn renew_members(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        leases.iter().map(|l| self.barriers.renew(l)).collect()
    }

    async fn remove_member(&self, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.barriers.remove(&lease.key, &lease.token))
    }
}
