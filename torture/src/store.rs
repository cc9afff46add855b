//! The fenced store's state machine: per key a value, the highest fence seen and the write
//! intervals open now; every write interval ends in one [`WriteRecord`].
//!
//! A worker's read-modify-write is an interval: `begin` reads the value (and opens the
//! interval), `commit` writes the new value (and closes it). The store is independent of
//! the lock service and trusts nothing but fences:
//!
//! - `begin` with a fence below the key's highest is refused at once (`Stale`); otherwise
//!   the fence becomes the highest.
//! - `commit` with a fence below the key's highest *now* is refused (`RejectedAtCommit`):
//!   a newer holder began meanwhile.
//! - Writes without a fence (Redlock, semaphore permits) are never refused.
//!
//! A `begin` that arrives while intervals of *other* workers are open on the key, at least
//! `limit` of them (1 for a lock, N for a semaphore of N permits), is an **overlap**; the
//! record lists the open intervals it overlapped. Whether an overlap did harm is decided
//! when both sides have closed (see `checker`): harm needs both writes accepted.

use std::collections::HashMap;
use std::fmt;

/// How a write interval ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The new value was stored.
    Accepted,
    /// Refused at `begin`: its fence was below the highest seen.
    Stale,
    /// Refused at `commit`: a higher fence began on the key meanwhile.
    RejectedAtCommit,
    /// The worker gave up before writing (it saw its lease was gone).
    Aborted,
    /// The worker's connection closed with the interval open (it was killed).
    Abandoned,
}

impl WriteOutcome {
    /// The word the store's log uses.
    pub fn name(self) -> &'static str {
        match self {
            WriteOutcome::Accepted => "accepted",
            WriteOutcome::Stale => "stale",
            WriteOutcome::RejectedAtCommit => "rejected",
            WriteOutcome::Aborted => "aborted",
            WriteOutcome::Abandoned => "abandoned",
        }
    }

    /// The outcome named `name`.
    pub fn from_name(name: &str) -> Option<WriteOutcome> {
        [
            WriteOutcome::Accepted,
            WriteOutcome::Stale,
            WriteOutcome::RejectedAtCommit,
            WriteOutcome::Aborted,
            WriteOutcome::Abandoned,
        ]
        .into_iter()
        .find(|o| o.name() == name)
    }

    /// Whether fencing refused the write.
    pub fn fenced_off(self) -> bool {
        matches!(self, WriteOutcome::Stale | WriteOutcome::RejectedAtCommit)
    }
}

/// One closed write interval, as the store logs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    /// The interval's id (unique per store).
    pub id: u64,
    /// The key written.
    pub key: String,
    /// The worker (`<worker>.<incarnation>`).
    pub worker: String,
    /// The fence it carried.
    pub fence: Option<u64>,
    /// How many holders the key admits (1 for a lock).
    pub limit: usize,
    /// When `begin` arrived (monotonic ns).
    pub begin_ns: u64,
    /// When the interval closed.
    pub end_ns: u64,
    /// How it ended.
    pub outcome: WriteOutcome,
    /// The intervals of other workers open on the key when this one began, if at least
    /// `limit` were: the overlap.
    pub overlaps: Vec<u64>,
}

impl fmt::Display for WriteRecord {
    /// One log line: `id key worker fence limit begin end outcome overlaps`, tab separated
    /// (`-` for no fence, no overlaps).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fence = self.fence.map_or("-".to_string(), |x| x.to_string());
        let overlaps = if self.overlaps.is_empty() {
            "-".to_string()
        } else {
            let ids: Vec<String> = self.overlaps.iter().map(u64::to_string).collect();
            ids.join(",")
        };
        write!(
            f,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            self.id,
            self.key,
            self.worker,
            fence,
            self.limit,
            self.begin_ns,
            self.end_ns,
            self.outcome.name(),
            overlaps
        )
    }
}

impl WriteRecord {
    /// Parses one log line written by `Display`.
    ///
    /// # Errors
    /// A message naming the line when it is not a record.
    pub fn parse(line: &str) -> Result<WriteRecord, String> {
        let bad = || format!("not a store record: `{line}`");
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 9 {
            return Err(bad());
        }
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        Ok(WriteRecord {
            id: num(f[0])?,
            key: f[1].to_string(),
            worker: f[2].to_string(),
            fence: if f[3] == "-" { None } else { Some(num(f[3])?) },
            limit: f[4].parse().map_err(|_| bad())?,
            begin_ns: num(f[5])?,
            end_ns: num(f[6])?,
            outcome: WriteOutcome::from_name(f[7]).ok_or_else(bad)?,
            overlaps: if f[8] == "-" {
                Vec::new()
            } else {
                f[8].split(',').map(num).collect::<Result<_, _>>()?
            },
        })
    }
}

/// What `begin` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The interval is open: write with [`Store::commit`] or give up with [`Store::abort`].
    Open {
        /// The interval's id.
        id: u64,
        /// The key's current value.
        value: u64,
    },
    /// Refused: the fence is below `highest`. The interval is already closed and logged.
    Stale {
        /// The record of the refused write.
        record: WriteRecord,
    },
}

/// What `commit` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Commit {
    /// Stored.
    Accepted(WriteRecord),
    /// Refused: a higher fence began on the key meanwhile.
    Rejected(WriteRecord),
}

#[derive(Debug, Default)]
struct KeyState {
    value: u64,
    highest: Option<u64>,
    open: Vec<u64>,
}

#[derive(Debug)]
struct OpenWrite {
    key: String,
    worker: String,
    fence: Option<u64>,
    limit: usize,
    begin_ns: u64,
    overlaps: Vec<u64>,
}

/// The store's whole state.
///
/// ```
/// use dlock_torture::store::{Begin, Commit, Store};
/// let mut store = Store::default();
/// let Begin::Open { id, value } = store.begin("k", "w1.0", Some(5), 1, 10) else { panic!() };
/// assert!(matches!(store.commit(id, value + 1, 20), Ok(Commit::Accepted(_))));
/// // an older fence is refused
/// assert!(matches!(store.begin("k", "w2.0", Some(4), 1, 30), Begin::Stale { .. }));
/// ```
#[derive(Debug, Default)]
pub struct Store {
    keys: HashMap<String, KeyState>,
    open: HashMap<u64, OpenWrite>,
    next_id: u64,
}

impl Store {
    /// Opens a write interval on `key` for `worker` with `fence`, at `now_ns`.
    pub fn begin(
        &mut self,
        key: &str,
        worker: &str,
        fence: Option<u64>,
        limit: usize,
        now_ns: u64,
    ) -> Begin {
        self.next_id += 1;
        let id = self.next_id;
        let state = self.keys.entry(key.to_string()).or_default();
        let others: Vec<u64> = state
            .open
            .iter()
            .copied()
            .filter(|o| self.open.get(o).is_some_and(|w| w.worker != worker))
            .collect();
        let overlaps = if others.len() >= limit.max(1) {
            others
        } else {
            Vec::new()
        };
        if let (Some(fence), Some(highest)) = (fence, state.highest) {
            if fence < highest {
                return Begin::Stale {
                    record: WriteRecord {
                        id,
                        key: key.to_string(),
                        worker: worker.to_string(),
                        fence: Some(fence),
                        limit,
                        begin_ns: now_ns,
                        end_ns: now_ns,
                        outcome: WriteOutcome::Stale,
                        overlaps,
                    },
                };
            }
        }
        if let Some(fence) = fence {
            state.highest = Some(state.highest.map_or(fence, |h| h.max(fence)));
        }
        state.open.push(id);
        let value = state.value;
        self.open.insert(
            id,
            OpenWrite {
                key: key.to_string(),
                worker: worker.to_string(),
                fence,
                limit,
                begin_ns: now_ns,
                overlaps,
            },
        );
        Begin::Open { id, value }
    }

    /// Writes `value` for interval `id` unless a higher fence began on its key meanwhile.
    ///
    /// # Errors
    /// No open interval `id` (never opened, or already closed).
    pub fn commit(&mut self, id: u64, value: u64, now_ns: u64) -> Result<Commit, String> {
        let write = self.take(id)?;
        let state = self.keys.entry(write.key.clone()).or_default();
        let stale = matches!((write.fence, state.highest), (Some(f), Some(h)) if f < h);
        if stale {
            Ok(Commit::Rejected(record(
                id,
                write,
                now_ns,
                WriteOutcome::RejectedAtCommit,
            )))
        } else {
            state.value = value;
            Ok(Commit::Accepted(record(
                id,
                write,
                now_ns,
                WriteOutcome::Accepted,
            )))
        }
    }

    /// Closes interval `id` without writing.
    ///
    /// # Errors
    /// No open interval `id`.
    pub fn abort(&mut self, id: u64, now_ns: u64) -> Result<WriteRecord, String> {
        let write = self.take(id)?;
        Ok(record(id, write, now_ns, WriteOutcome::Aborted))
    }

    /// Closes every interval `worker` left open (its connection closed).
    pub fn abandon(&mut self, worker: &str, now_ns: u64) -> Vec<WriteRecord> {
        let mut ids: Vec<u64> = self
            .open
            .iter()
            .filter(|(_, w)| w.worker == worker)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter_map(|id| {
                let write = self.take(id).ok()?;
                Some(record(id, write, now_ns, WriteOutcome::Abandoned))
            })
            .collect()
    }

    /// Closes every open interval (the store is shutting down).
    pub fn abandon_all(&mut self, now_ns: u64) -> Vec<WriteRecord> {
        let mut workers: Vec<String> = self.open.values().map(|w| w.worker.clone()).collect();
        workers.sort();
        workers.dedup();
        workers
            .iter()
            .flat_map(|w| self.abandon(w, now_ns))
            .collect()
    }

    /// The value stored under `key` (0 if never written).
    pub fn value(&self, key: &str) -> u64 {
        self.keys.get(key).map_or(0, |s| s.value)
    }

    fn take(&mut self, id: u64) -> Result<OpenWrite, String> {
        let write = self
            .open
            .remove(&id)
            .ok_or_else(|| format!("no open write interval {id}"))?;
        if let Some(state) = self.keys.get_mut(&write.key) {
            state.open.retain(|o| *o != id);
        }
        Ok(write)
    }
}

fn record(id: u64, write: OpenWrite, end_ns: u64, outcome: WriteOutcome) -> WriteRecord {
    WriteRecord {
        id,
        key: write.key,
        worker: write.worker,
        fence: write.fence,
        limit: write.limit,
        begin_ns: write.begin_ns,
        end_ns,
        outcome,
        overlaps: write.overlaps,
    }
}
