//! Leader election in memory: each election's record (the leader's token,
//! value and term) beside the lock of its name, and a generation counter
//! per observed election that every change bumps.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::watch;

use super::MemoryBackend;
use crate::backend::{ElectionBackend, Leader, LeaderChanges, Lease};
use crate::LockError;

/// The records and the watchers of every election of one backend.
#[derive(Debug, Default)]
pub(super) struct ElectionTable {
    /// Election name → the record its leader published. A record whose
    /// token no longer holds the lock is shown to nobody, and replaced by
    /// the next leader's.
    records: Mutex<HashMap<String, Record>>,
    /// Election name → its generation, for the observers of that election;
    /// dropped with the last observer.
    watchers: Mutex<HashMap<String, watch::Sender<u64>>>,
}

#[derive(Debug)]
struct Record {
    token: String,
    leader: Leader,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is one insert or remove: poisoning cannot leave a half.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ElectionTable {
    /// Wakes the observers of `name`, and forgets its counter once nobody
    /// observes it.
    fn announce(&self, name: &str) {
        let mut watchers = lock(&self.watchers);
        if let Some(generation) = watchers.get(name) {
            if generation.receiver_count() == 0 {
                watchers.remove(name);
            } else {
                generation.send_modify(|g| *g += 1);
            }
        }
    }
}

/// One observer's wake-ups.
struct Changes(watch::Receiver<u64>);

#[async_trait]
impl LeaderChanges for Changes {
    async fn changed(&mut self) -> bool {
        if self.0.changed().await.is_err() {
            // The table outlives its observers' receivers only with the
            // backend; a dropped backend announces nothing more.
            std::future::pending::<()>().await;
        }
        true
    }
}

#[async_trait]
impl ElectionBackend for MemoryBackend {
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool, LockError> {
        let Some(term) = lease.fencing_token else {
            return Ok(false);
        };
        {
            // Checked and written under the lock table's mutex: a release
            // cannot come between the check and the write.
            let state = self.lock_state();
            let now = std::time::Instant::now();
            let holds = state
                .get(&lease.key)
                .and_then(|entry| entry.holder.as_ref())
                .is_some_and(|h| h.token == lease.token && h.expires > now);
            if !holds {
                return Ok(false);
            }
            lock(&self.elections.records).insert(
                lease.key.clone(),
                Record {
                    token: lease.token.clone(),
                    leader: Leader {
                        value: value.to_owned(),
                        term,
                    },
                },
            );
        }
        self.elections.announce(&lease.key);
        Ok(true)
    }

    async fn withdraw(&self, lease: &Lease) -> Result<(), LockError> {
        let removed = {
            let mut records = lock(&self.elections.records);
            let ours = records
                .get(&lease.key)
                .is_some_and(|r| r.token == lease.token);
            ours && records.remove(&lease.key).is_some()
        };
        if removed {
            self.elections.announce(&lease.key);
        }
        Ok(())
    }

    async fn leader(&self, name: &str) -> Result<Option<Leader>, LockError> {
        let Some(holder) = self.holder(name) else {
            return Ok(None);
        };
        Ok(lock(&self.elections.records)
            .get(name)
            .filter(|r| r.token == holder)
            .map(|r| r.leader.clone()))
    }

    async fn watch(&self, name: &str) -> Result<Box<dyn LeaderChanges>, LockError> {
        let mut watchers = lock(&self.elections.watchers);
        let generation = watchers
            .entry(name.to_owned())
            .or_insert_with(|| watch::channel(0).0);
        Ok(Box::new(Changes(generation.subscribe())))
    }
}
