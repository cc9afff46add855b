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
    /// What this process's line of waiters for the key heard from the
    /// server (`lease/outcome.rs`): whether a wait that ends without an
    /// answer of its own was behind contention or in an outage. It lives as
    /// long as the slot, that is while a holder or a waiter of the key does.
    hearing: Mutex<Hearing>,
}

/// What one key's local line heard from the server, and when.
#[derive(Debug, Default)]
struct Hearing {
    /// The last answer about the key (held by another, granted), or the
    /// last hand-over of a local holder's turn (the key was held until
    /// then).
    answered_at: Option<Instant>,
    /// The last failure (no answer in time, a refused or reset
    /// connection), as the error showed it (credentials redacted).
    failure: Option<(Instant, Arc<str>)>,
    /// Since when the backend call now out on the key has sent requests
    /// without an answer (set by backends that report what they send and
    /// hear, `backend/hearing.rs`; cleared by an answer and by the call's
    /// end).
    asking_since: Option<Instant>,
    /// Turns held by granted leases of this process.
    holders: usize,
}

/// How a wait that ran out without an answer of its own ends
/// (`lease/outcome.rs`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Behind contention: `Timeout`.
    Contention,
    /// An outage: `Backend`, with what the line last heard.
    Outage(String),
}

impl Hearing {
    /// Whether the last failure came after the last answer (or with none).
    fn failing(&self) -> Option<&(Instant, Arc<str>)> {
        self.failure
            .as_ref()
            .filter(|(at, _)| self.answered_at.is_none_or(|answered| *at >= answered))
    }
}

impl KeySlot {
    /// Records an answer of the server about the key.
    pub(crate) fn answered(&self) {
        let mut hearing = lock(&self.hearing);
        hearing.answered_at = Some(Instant::now());
        hearing.asking_since = None;
    }

    /// Records a request sent on the key, unanswered so far.
    pub(crate) fn sending(&self) {
        lock(&self.hearing)
            .asking_since
            .get_or_insert_with(Instant::now);
    }

    /// Records a failure of a backend call on the key.
    pub(crate) fn failed(&self, failure: String) {
        lock(&self.hearing).failure = Some((Instant::now(), failure.into()));
    }

    /// Marks a backend call on the key as out until the returned mark is
    /// dropped (cancelled calls included): its unanswered requests stop
    /// counting then.
    pub(crate) fn calling(&self) -> Calling<'_> {
        Calling {
            slot: self,
            since: Instant::now(),
        }
    }

    /// A waiter that began at `began` ran out in the line, never asking the
    /// server itself. An outage if the line's last word is a failure, or if
    /// nothing was heard during the wait and the call ahead has had a
    /// request out unanswered since before the wait began; else contention (a local holder, an answer during
    /// the wait, or a call ahead waiting after its "held").
    pub(crate) fn verdict_in_line(&self, began: Instant) -> Verdict {
        let hearing = lock(&self.hearing);
        if hearing.holders > 0 {
            return Verdict::Contention;
        }
        if let Some((_, failure)) = hearing.failing() {
            return Verdict::Outage(format!(
                "the wait ran out in this process's line for the key, behind a waiter whose last request failed: {failure}"
            ));
        }
        if hearing.answered_at.is_some_and(|a| a >= began) {
            return Verdict::Contention;
        }
        // Silent throughout this wait, or it is not an outage: a request
        // sent during the wait may just be in flight on a healthy server.
        let Some(since) = hearing.asking_since.filter(|since| *since <= began) else {
            // Nothing heard of an outage: the waiter ahead is in a
            // server-side wait after its answer, or its backend does not
            // report what it hears (`backend/hearing.rs`).
            return Verdict::Contention;
        };
        Verdict::Outage(format!(
            "the wait ran out in this process's line for the key, behind a waiter whose request has had no answer from the server for {:?}",
            since.elapsed()
        ))
    }

    /// Whether the line heard an answer since `since` with no failure after
    /// it: a call of this wait that ended unanswered was cut by the wait's
    /// end behind contention, not by silence.
    pub(crate) fn answered_since(&self, since: Instant) -> bool {
        let hearing = lock(&self.hearing);
        hearing.answered_at.is_some_and(|a| a >= since) && hearing.failing().is_none()
    }
}

/// A backend call on a key, out (see [`KeySlot::calling`]).
pub(crate) struct Calling<'a> {
    slot: &'a KeySlot,
    since: Instant,
}

impl Drop for Calling<'_> {
    fn drop(&mut self) {
        let mut hearing = lock(&self.slot.hearing);
        // A request out since before this call began is another call's (a
        // semaphore's gate lets several out): left counting.
        if hearing.asking_since.is_some_and(|at| at >= self.since) {
            hearing.asking_since = None;
        }
    }
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
    /// Held by a granted lease (counted in the line's holders).
    holding: bool,
}

impl Turn {
    /// The key slot this turn is on (what its line heard).
    pub(crate) fn line(&self) -> &Arc<KeySlot> {
        &self.slot
    }

    /// The turn now belongs to a granted lease: until it is handed on, a
    /// waiter that runs out behind it was behind contention.
    pub(crate) fn hold(&mut self) {
        if !self.holding {
            self.holding = true;
            lock(&self.slot.hearing).holders += 1;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.holding {
            let mut hearing = lock(&self.slot.hearing);
            hearing.holders -= 1;
            // The key was held until now: a wait that ran during the hold
            // was behind contention.
            hearing.answered_at = Some(Instant::now());
        }
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
            hearing: Mutex::default(),
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
        self.turn_or_verdict(slot, weight, once, deadline, Instant::now())
            .await
            .ok()
    }

    /// [`turn_of`](Self::turn_of); with no turn in time, the line's
    /// verdict for a wait that began at `began`, read before the slot may
    /// be pruned: whether the waiter ran out behind contention or behind a
    /// failing server.
    pub(crate) async fn turn_or_verdict(
        self: &Arc<Self>,
        slot: Arc<KeySlot>,
        weight: usize,
        once: bool,
        deadline: Option<Instant>,
        began: Instant,
    ) -> Result<Turn, Verdict> {
        // Callers pass 1 or the capacity, which `slot_with` keeps within
        // `u32`; the clamps only keep a wrong weight from panicking or
        // waiting for permits that do not exist.
        let weight = u32::try_from(weight.clamp(1, turn_capacity(&slot))).unwrap_or(u32::MAX);
        let mut turn = Turn {
            permit: None,
            slot,
            queue: self.clone(),
            holding: false,
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
        match turn.permit {
            Some(_) => Ok(turn),
            // One attempt found the line busy: this process holds or asks
            // for the key right now (`Busy`); it waited for nothing.
            None if once => Err(Verdict::Contention),
            None => Err(turn.slot.verdict_in_line(began)),
        }
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
