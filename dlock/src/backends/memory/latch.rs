//! Count-down latches in memory: a count per name in a `watch` channel,
//! which every waiter of that name shares. An entry lives while its count
//! is live or someone waits on it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::watch;

use super::MemoryBackend;
use crate::backend::LatchBackend;
use crate::LockError;

/// The latches of one backend: name → its count.
#[derive(Debug, Default)]
pub(super) struct LatchTable {
    by_name: Mutex<HashMap<String, watch::Sender<u64>>>,
}

fn lock(
    m: &Mutex<HashMap<String, watch::Sender<u64>>>,
) -> MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
    // Every update is one step on one entry: poisoning cannot leave a half.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LatchTable {
    /// Forgets `name` if its count is zero and nobody waits on it.
    fn forget_if_idle(map: &mut HashMap<String, watch::Sender<u64>>, name: &str) {
        if map
            .get(name)
            .is_some_and(|count| *count.borrow() == 0 && count.receiver_count() == 0)
        {
            map.remove(name);
        }
    }

    /// How many latches the table keeps (live counts and waited-on names).
    pub(super) fn len(&self) -> usize {
        lock(&self.by_name).len()
    }
}

/// A waiter's share of a name's channel; the entry goes with the last
/// waiter of a name at zero.
struct Waiting<'a> {
    table: &'a LatchTable,
    name: &'a str,
    count: Option<watch::Receiver<u64>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut map = lock(&self.table.by_name);
        drop(self.count.take());
        LatchTable::forget_if_idle(&mut map, self.name);
    }
}

#[async_trait]
impl LatchBackend for MemoryBackend {
    async fn try_set_count(&self, name: &str, count: u64) -> Result<bool, LockError> {
        let mut map = lock(&self.latches.by_name);
        let entry = map
            .entry(name.to_owned())
            .or_insert_with(|| watch::channel(0).0);
        if *entry.borrow() > 0 {
            return Ok(false);
        }
        entry.send_replace(count);
        Ok(true)
    }

    async fn count_down(&self, name: &str) -> Result<(), LockError> {
        let mut map = lock(&self.latches.by_name);
        if let Some(entry) = map.get(name) {
            entry.send_if_modified(|count| {
                let live = *count > 0;
                *count = count.saturating_sub(1);
                live
            });
        }
        LatchTable::forget_if_idle(&mut map, name);
        Ok(())
    }

    async fn count(&self, name: &str) -> Result<u64, LockError> {
        Ok(lock(&self.latches.by_name)
            .get(name)
            .map_or(0, |count| *count.borrow()))
    }

    async fn wait_zero(&self, name: &str, deadline: Option<Instant>) -> Result<bool, LockError> {
        let receiver = {
            let map = lock(&self.latches.by_name);
            match map.get(name) {
                None => return Ok(true),
                Some(count) if *count.borrow() == 0 => return Ok(true),
                Some(count) => count.subscribe(),
            }
        };
        let mut waiting = Waiting {
            table: &self.latches,
            name,
            count: Some(receiver),
        };
        let Some(count) = waiting.count.as_mut() else {
            return Ok(true);
        };
        let zero = crate::backend::deadline::until(deadline, count.wait_for(|c| *c == 0)).await;
        // The sender lives in the table while this waiter does.
        Ok(zero.is_some())
    }
}
