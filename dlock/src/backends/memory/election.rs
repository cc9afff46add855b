//! Leader election in memory: each election's record (the leader's token,
//! value and term) beside the lock of its name, and the inboxes of the
//! election's observers, into which every change of the record is put as
//! it is made.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;

use super::ticket::lock_table;
use super::MemoryBackend;
use crate::backend::{ElectionBackend, Leader, LeaderChange, LeaderChanges, Lease};
use crate::backends::announcements::{Inbox, Inboxes};
use crate::LockError;

/// The records and the watchers of every election of one backend.
#[derive(Debug, Default)]
pub(super) struct ElectionTable {
    /// Election name → the record its leader published. A record whose
    /// token no longer holds the lock is shown to nobody, and replaced by
    /// the next leader's.
    records: Mutex<HashMap<String, Record>>,
    /// Election name → the inboxes of its observers; an observer's goes
    /// with it.
    watchers: Mutex<HashMap<String, Inboxes>>,
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
    /// Puts `change` into the inboxes of the observers of `name`, and
    /// forgets the observers that are gone.
    fn announce(&self, name: &str, change: &LeaderChange) {
        let mut watchers = lock(&self.watchers);
        if let Some(inboxes) = watchers.get_mut(name)
            && !inboxes.deliver(change)
        {
            watchers.remove(name);
        }
    }
}

/// One observer's inbox.
struct Changes(std::sync::Arc<Inbox>);

#[async_trait]
impl LeaderChanges for Changes {
    async fn changed(&mut self) -> LeaderChange {
        self.0.next().await
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
            let state = lock_table(&self.state);
            let now = std::time::Instant::now();
            let holds = state
                .get(&lease.key)
                .and_then(|entry| entry.holder.as_ref())
                .is_some_and(|h| h.token == lease.token && h.expires > now);
            if !holds {
                return Ok(false);
            }
            let leader = Leader {
                value: value.to_owned(),
                term,
            };
            lock(&self.elections.records).insert(
                lease.key.clone(),
                Record {
                    token: lease.token.clone(),
                    leader: leader.clone(),
                },
            );
            // Still under the lock table's mutex: announcements go out in
            // the order the records were written.
            self.elections
                .announce(&lease.key, &LeaderChange::Elected(leader));
        }
        Ok(true)
    }

    async fn withdraw(&self, lease: &Lease) -> Result<(), LockError> {
        let _state = lock_table(&self.state);
        let removed = {
            let mut records = lock(&self.elections.records);
            let ours = records
                .get(&lease.key)
                .is_some_and(|r| r.token == lease.token);
            ours.then(|| records.remove(&lease.key)).flatten()
        };
        if let Some(record) = removed {
            let term = record.leader.term;
            self.elections
                .announce(&lease.key, &LeaderChange::Ended { term });
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
        let inbox = lock(&self.elections.watchers)
            .entry(name.to_owned())
            .or_default()
            .add();
        Ok(Box::new(Changes(inbox)))
    }
}
