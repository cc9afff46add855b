//! The local wait queue of one backend: a gate per key, so only one waiter
//! of this process talks to the service for it while the rest queue here
//! (for a read-write lock: its readers together, or one writer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::backend::RwMode;

/// The key slots of one backend, by name.
#[derive(Debug, Default)]
pub(crate) struct LocalQueue {
    slots: Mutex<HashMap<Arc<str>, Arc<KeySlot>>>,
}

/// One key's local state.
#[derive(Debug)]
pub(crate) struct KeySlot {
    /// Held from the start of a backend acquire until the lease is released
    /// or lost, so the other local waiters queue here (FIFO, tokio's
    /// semaphore is fair) instead of all asking the service.
    gate: Arc<Semaphore>,
    /// The gate's number of permits: 1 for a lock, N for a semaphore of N,
    /// [`RW_READERS`] for a read-write lock.
    capacity: usize,
    /// The slot's name in the map, for pruning it when nobody uses it
    /// (shared with the map's key: one allocation per slot, not two).
    name: Arc<str>,
}

/// The gate permits of a read-write lock's slot: a reader takes one, a
/// writer all of them. Far more local readers than any process runs, and
/// within what tokio's `acquire_many` takes (a `u32`).
pub(crate) const RW_READERS: usize = 1 << 20;

/// A place on a [`KeySlot`]: while it lives, the slot stays in the map; when
/// it is dropped, the permit (if one was granted) goes back and the slot is
/// pruned if nobody else uses it. So a slot lives exactly as long as a
/// holder or a waiter of its key, whichever way they end (released, lost,
/// timed out, cancelled).
#[derive(Debug)]
pub(crate) struct Turn {
    permit: Option<OwnedSemaphorePermit>,
    slot: Arc<KeySlot>,
    queue: Arc<LocalQueue>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.queue.prune_released(&self.slot);
    }
}

/// The most permits a turn on `slot` can take.
fn turn_capacity(slot: &KeySlot) -> usize {
    slot.capacity.max(1)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under this mutex is a single insert or remove, so a
    // poisoned mutex still guards consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LocalQueue {
    /// The slot of `key`. Looked up by `&str` first: the common case
    /// allocates nothing.
    pub(crate) fn slot(&self, key: &str) -> Arc<KeySlot> {
        if let Some(slot) = lock(&self.slots).get(key) {
            return slot.clone();
        }
        self.slot_with(key, 1)
    }

    /// The slot of the semaphore `name` with `permits` permits, whose gate
    /// lets that many local tasks talk to the service at once (the rest
    /// queue locally). Its map name starts with a control character, which
    /// no lock key may contain, so a semaphore and a lock of the same name
    /// never share a slot; it holds the count too, so a user that gives
    /// another count gets a gate of its own, not the first user's.
    pub(crate) fn semaphore_slot(&self, name: &str, permits: usize) -> Arc<KeySlot> {
        self.slot_with(&format!("\u{1}semaphore:{permits}:{name}"), permits)
    }

    /// The slot of the barrier `name` with `parties` parties: that many
    /// local members at once (each keeps its turn until it leaves). Named
    /// apart from locks and semaphores, as `semaphore_slot`.
    pub(crate) fn barrier_slot(&self, name: &str, parties: usize) -> Arc<KeySlot> {
        self.slot_with(&format!("\u{1}barrier:{parties}:{name}"), parties)
    }

    /// The admission slot of the segmented lock `key` with `segments`
    /// segments: at most that many local tasks look for a segment at once.
    /// Named apart from locks and semaphores, as `semaphore_slot`.
    pub(crate) fn segments_slot(&self, key: &str, segments: usize) -> Arc<KeySlot> {
        self.slot_with(&format!("\u{1}segments:{segments}:{key}"), segments)
    }

    /// The slot of the read-write lock `key` and how many of its gate's
    /// permits a `mode` holder takes: one for a reader, all for a writer.
    /// tokio's semaphore is fair, so a writer waiting for all the permits
    /// stops every reader that asks after it: writers are preferred
    /// locally as on the server. Named apart from a plain lock of the same
    /// key (the server keeps them apart too), as `semaphore_slot`.
    pub(crate) fn rw_slot(&self, key: &str, mode: RwMode) -> (Arc<KeySlot>, usize) {
        let slot = self.slot_with(&format!("\u{1}rw:{key}"), RW_READERS);
        let weight = match mode {
            RwMode::Read => 1,
            RwMode::Write => RW_READERS,
        };
        (slot, weight)
    }

    fn slot_with(&self, name: &str, capacity: usize) -> Arc<KeySlot> {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(name) {
            return slot.clone();
        }
        // Callers bound their counts far below tokio's limits; the clamp
        // only keeps `Semaphore::new` (and a writer's `acquire_many`, a
        // `u32`) from panicking should one not.
        let capacity = capacity.min(Semaphore::MAX_PERMITS).min(u32::MAX as usize);
        let name: Arc<str> = name.into();
        let slot = Arc::new(KeySlot {
            gate: Arc::new(Semaphore::new(capacity)),
            capacity,
            name: name.clone(),
        });
        slots.insert(name, slot.clone());
        slot
    }

    /// Waits for this process's turn on `slot`: one attempt if `once`, else
    /// until `deadline` (`None`: no limit). `None`: no turn in time (the
    /// slot is pruned then if nobody else uses it).
    ///
    /// Cancel safe: tokio's semaphore gives up a queued place when dropped,
    /// and the slot is pruned then too.
    pub(crate) async fn turn(
        self: &Arc<Self>,
        slot: Arc<KeySlot>,
        once: bool,
        deadline: Option<Instant>,
    ) -> Option<Turn> {
        self.turn_of(slot, 1, once, deadline).await
    }

    /// [`turn`](Self::turn) taking `weight` of the gate's permits at once
    /// (a writer's [`rw_slot`](Self::rw_slot) weight), clamped to the
    /// gate's capacity.
    pub(crate) async fn turn_of(
        self: &Arc<Self>,
        slot: Arc<KeySlot>,
        weight: usize,
        once: bool,
        deadline: Option<Instant>,
    ) -> Option<Turn> {
        // Callers pass 1 or the capacity, which `slot_with` keeps within
        // `u32`; the clamps only keep a wrong weight from panicking or
        // waiting for permits that do not exist.
        let weight = u32::try_from(weight.clamp(1, turn_capacity(&slot))).unwrap_or(u32::MAX);
        let mut turn = Turn {
            permit: None,
            slot,
            queue: self.clone(),
        };
        let gate = turn.slot.gate.clone();
        turn.permit = if once {
            gate.try_acquire_many_owned(weight).ok()
        } else {
            // dlock never closes a gate, so `acquire_many_owned` cannot fail.
            crate::backend::deadline::until(deadline, gate.acquire_many_owned(weight))
                .await
                .and_then(Result::ok)
        };
        turn.permit.is_some().then_some(turn)
    }

    /// Drops `slot` from the map if nobody uses it any more: only the map
    /// and the caller (a [`Turn`] being dropped) hold it, and no permit of
    /// its gate is out. So a process that locks many distinct keys does not
    /// keep one slot per key.
    fn prune_released(&self, slot: &Arc<KeySlot>) {
        let mut slots = lock(&self.slots);
        let unused = slots.get(&*slot.name).is_some_and(|s| {
            Arc::ptr_eq(s, slot)
                && Arc::strong_count(slot) == 2
                && slot.gate.available_permits() == slot.capacity
        });
        if unused {
            slots.remove(&*slot.name);
        }
    }

    /// How many key slots this queue keeps.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        lock(&self.slots).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiting_writer_stops_later_readers_at_the_gate() {
        let queue = Arc::new(LocalQueue::default());
        let read = |queue: &Arc<LocalQueue>| queue.rw_slot("k", RwMode::Read);
        let (slot, weight) = read(&queue);
        let first = queue.turn_of(slot, weight, true, None).await.unwrap();
        let (slot, weight) = read(&queue);
        let second = queue.turn_of(slot, weight, true, None).await;
        assert!(second.is_some(), "readers share the gate");
        let writing = tokio::spawn({
            let queue = queue.clone();
            async move {
                let (slot, weight) = queue.rw_slot("k", RwMode::Write);
                queue.turn_of(slot, weight, false, None).await
            }
        });
        let turned_away = async {
            loop {
                let (slot, weight) = read(&queue);
                if queue.turn_of(slot, weight, true, None).await.is_none() {
                    break;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), turned_away)
            .await
            .expect("a waiting writer never stopped a later reader");
        drop((first, second));
        let writer = writing.await.unwrap().expect("the writer's turn");
        // The plain lock of the same key has a gate of its own.
        let plain = queue.turn(queue.slot("k"), true, None).await;
        assert!(plain.is_some(), "a lock shared the read-write gate");
        drop((writer, plain));
        assert_eq!(queue.slot_count(), 0, "slots outlived their turns");
    }
}
