//! The read-write locks of the in-process backend: per key, a writer, a
//! table of readers with server-side deadlines, and one FIFO queue of
//! waiters of both modes in which a writer stops the readers behind it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::table;
use super::ticket::{lock_table, Table};
use super::ticket::{Queued, Waiters};
use crate::backend::deadline::saturating_add;
use crate::backend::{lease_deadline, Lease, Renewal, RwMode, RwRequest};
use crate::LockError;

/// Every read-write lock of one `MemoryBackend`.
#[derive(Debug, Default)]
pub(super) struct RwTable {
    state: Table<RwState>,
    next_ticket: AtomicU64,
}

#[derive(Debug)]
struct RwState {
    /// The writer's token and server-side expiry.
    writer: Option<(String, Instant)>,
    /// Reader token → server-side expiry: each reader expires on its own.
    readers: HashMap<String, Instant>,
    /// Waiters in arrival order. A ticket's lowest bit is its mode (1: a
    /// writer), so the queue alone tells a reader whether a writer waits
    /// ahead of it.
    waiters: Waiters,
}

/// Whether the waiting ticket `id` is a writer's.
fn is_writer(id: u64) -> bool {
    id & 1 == 1
}

impl Queued for RwState {
    fn new() -> Self {
        RwState {
            writer: None,
            readers: HashMap::new(),
            waiters: Waiters::new(),
        }
    }

    fn waiters(&mut self) -> &mut Waiters {
        &mut self.waiters
    }

    /// Also wakes waiters if that freed any lease.
    fn expire(&mut self, now: Instant) {
        let before = self.readers.len();
        self.readers.retain(|_, expires| *expires > now);
        let writer_gone = self.writer.as_ref().is_some_and(|(_, e)| *e <= now);
        if writer_gone {
            self.writer = None;
        }
        if writer_gone || self.readers.len() < before {
            self.waiters.changed.notify_waiters();
        }
    }

    fn earliest_expiry(&self) -> Option<Instant> {
        let writer = self.writer.as_ref().map(|(_, e)| *e);
        self.readers.values().copied().chain(writer).min()
    }

    fn is_idle(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty() && self.waiters.queue.is_empty()
    }
}

impl RwState {
    /// Whether a `mode` lease for `ticket` (`None`: a one-shot try) may be
    /// granted now. A writer needs the key empty and to be first in line; a
    /// reader needs no writer holding and no writer waiting ahead of it.
    fn admits(&self, mode: RwMode, ticket: Option<u64>) -> bool {
        if self.writer.is_some() {
            return false;
        }
        match (mode, ticket) {
            (RwMode::Write, Some(t)) => {
                self.readers.is_empty() && self.waiters.queue.front() == Some(&t)
            }
            (RwMode::Write, None) => self.readers.is_empty() && self.waiters.queue.is_empty(),
            (RwMode::Read, Some(t)) => !self
                .waiters
                .queue
                .iter()
                .take_while(|waiting| **waiting != t)
                .any(|waiting| is_writer(*waiting)),
            (RwMode::Read, None) => !self.waiters.queue.iter().any(|waiting| is_writer(*waiting)),
        }
    }
}

/// The local name of the lease, shown as its resource.
fn resource(req: &RwRequest) -> String {
    format!("rw:{}:{}", req.key, req.mode.as_str())
}

impl RwTable {
    /// Takes a `req.mode` lease if the key admits it for `ticket`.
    /// `fence` is the backend's counter: a writer draws the next value, a
    /// reader reads the current one, which no earlier write exceeds and
    /// every later write does.
    fn take_if_free(
        entry: &mut RwState,
        req: &RwRequest,
        ticket: Option<u64>,
        sent: Instant,
        fence: &AtomicU64,
    ) -> Option<Lease> {
        let now = Instant::now();
        entry.expire(now);
        if !entry.admits(req.mode, ticket) {
            return None;
        }
        if let Some(t) = ticket {
            entry.waiters.queue.retain(|waiting| *waiting != t);
        }
        let expires = saturating_add(now, req.ttl);
        let fencing_token = match req.mode {
            RwMode::Write => {
                entry.writer = Some((req.token.clone(), expires));
                fence.fetch_add(1, Ordering::SeqCst) + 1
            }
            RwMode::Read => {
                entry.readers.insert(req.token.clone(), expires);
                fence.load(Ordering::SeqCst)
            }
        };
        Some(Lease {
            key: req.key.clone(),
            token: req.token.clone(),
            ttl: req.ttl,
            fencing_token: Some(fencing_token),
            valid_until: lease_deadline(sent, req.ttl),
            resource: resource(req),
        })
    }

    pub(super) fn try_acquire(&self, req: &RwRequest, fence: &AtomicU64) -> Option<Lease> {
        let sent = Instant::now();
        table::try_once(&self.state, &req.key, |entry| {
            Self::take_if_free(entry, req, None, sent, fence)
        })
    }

    pub(super) async fn acquire(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
        fence: &AtomicU64,
    ) -> Result<Option<Lease>, LockError> {
        let number = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let id = number << 1 | u64::from(req.mode == RwMode::Write);
        table::wait_in_line(&self.state, &req.key, id, deadline, |entry, id, sent| {
            Ok(Self::take_if_free(entry, req, Some(id), sent, fence))
        })
        .await
    }

    /// The server-side expiry of the `mode` lease `token` on `entry`.
    fn expiry_of<'a>(entry: &'a mut RwState, mode: RwMode, token: &str) -> Option<&'a mut Instant> {
        match mode {
            RwMode::Read => entry.readers.get_mut(token),
            RwMode::Write => entry
                .writer
                .as_mut()
                .filter(|(holder, _)| holder == token)
                .map(|(_, expires)| expires),
        }
    }

    pub(super) fn renew(&self, mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        table::renew_each(&self.state, leases, |entry, token| {
            Self::expiry_of(entry, mode, token)
        })
    }

    pub(super) fn release(&self, mode: RwMode, lease: &Lease) -> bool {
        table::release(&self.state, &lease.key, |entry| match mode {
            RwMode::Read => entry.readers.remove(&lease.token).is_some(),
            RwMode::Write => {
                let ours = entry
                    .writer
                    .as_ref()
                    .is_some_and(|(holder, _)| *holder == lease.token);
                if ours {
                    entry.writer = None;
                }
                ours
            }
        })
    }

    /// Removes every lease (readers and writer) of `key` behind their
    /// holders' backs. Returns how many.
    pub(super) fn force_expire(&self, key: &str) -> usize {
        table::force_remove(&self.state, key, |entry| {
            let removed = entry.readers.len() + usize::from(entry.writer.is_some());
            entry.readers.clear();
            entry.writer = None;
            removed
        })
    }

    /// How many live readers and whether a live writer hold `key`.
    pub(super) fn holders(&self, key: &str) -> (usize, bool) {
        let now = Instant::now();
        lock_table(&self.state).get(key).map_or((0, false), |e| {
            let readers = e.readers.values().filter(|x| **x > now).count();
            let writer = e.writer.as_ref().is_some_and(|(_, x)| *x > now);
            (readers, writer)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn req(key: &str, mode: RwMode, token: &str, ttl_ms: u64) -> RwRequest {
        RwRequest {
            key: key.into(),
            mode,
            token: token.into(),
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    #[test]
    fn readers_share_and_a_writer_excludes_them() {
        let (t, fence) = (RwTable::default(), AtomicU64::new(0));
        let a = t
            .try_acquire(&req("k", RwMode::Read, "a", 5_000), &fence)
            .unwrap();
        assert!(t
            .try_acquire(&req("k", RwMode::Read, "b", 5_000), &fence)
            .is_some());
        assert!(t
            .try_acquire(&req("k", RwMode::Write, "w", 5_000), &fence)
            .is_none());
        assert_eq!(t.holders("k"), (2, false));
        assert!(t.release(RwMode::Read, &a));
        assert!(!t.release(RwMode::Read, &a), "released twice");
        assert_eq!(t.force_expire("k"), 1);
        let w = t
            .try_acquire(&req("k", RwMode::Write, "w", 5_000), &fence)
            .unwrap();
        assert!(t
            .try_acquire(&req("k", RwMode::Read, "c", 5_000), &fence)
            .is_none());
        assert!(
            !t.release(RwMode::Read, &w),
            "a write lease is not a read lease"
        );
        assert!(t.release(RwMode::Write, &w));
        assert_eq!(t.holders("k"), (0, false));
    }

    #[test]
    fn each_reader_expires_on_its_own() {
        let (t, fence) = (RwTable::default(), AtomicU64::new(0));
        let short = t
            .try_acquire(&req("k", RwMode::Read, "s", 30), &fence)
            .unwrap();
        let long = t
            .try_acquire(&req("k", RwMode::Read, "l", 5_000), &fence)
            .unwrap();
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(t.holders("k"), (1, false));
        let answers = t.renew(RwMode::Read, &[short, long]);
        assert!(matches!(answers[0], Ok(Renewal::Refused)));
        assert!(matches!(answers[1], Ok(Renewal::Renewed { .. })));
    }

    #[test]
    fn fences_order_reads_between_writes() {
        let (t, fence) = (RwTable::default(), AtomicU64::new(0));
        let w1 = t
            .try_acquire(&req("k", RwMode::Write, "w1", 5_000), &fence)
            .unwrap();
        assert!(t.release(RwMode::Write, &w1));
        let r = t
            .try_acquire(&req("k", RwMode::Read, "r", 5_000), &fence)
            .unwrap();
        assert_eq!(
            r.fencing_token, w1.fencing_token,
            "a read names the write it follows"
        );
        assert!(t.release(RwMode::Read, &r));
        let w2 = t
            .try_acquire(&req("k", RwMode::Write, "w2", 5_000), &fence)
            .unwrap();
        assert!(w2.fencing_token > r.fencing_token);
    }

    #[tokio::test]
    async fn a_waiting_writer_stops_later_readers() {
        let (t, fence) = (Arc::new(RwTable::default()), Arc::new(AtomicU64::new(0)));
        let r = t
            .try_acquire(&req("k", RwMode::Read, "r", 5_000), &fence)
            .unwrap();
        let writer = {
            let (t, fence) = (t.clone(), fence.clone());
            tokio::spawn(async move {
                t.acquire(&req("k", RwMode::Write, "w", 5_000), None, &fence)
                    .await
            })
        };
        // The writer is in line once its ticket is queued.
        while lock_table(&t.state)
            .get("k")
            .is_none_or(|e| e.waiters.queue.is_empty())
        {
            tokio::task::yield_now().await;
        }
        assert!(
            t.try_acquire(&req("k", RwMode::Read, "late", 5_000), &fence)
                .is_none(),
            "a reader got in ahead of a waiting writer"
        );
        assert!(t.release(RwMode::Read, &r));
        let w = writer
            .await
            .unwrap()
            .unwrap()
            .expect("the writer was served");
        assert!(t.release(RwMode::Write, &w));
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_no_ticket() {
        let (t, fence) = (RwTable::default(), AtomicU64::new(0));
        let held = t
            .try_acquire(&req("k", RwMode::Read, "h", 5_000), &fence)
            .unwrap();
        let waited = tokio::time::timeout(
            Duration::from_millis(20),
            t.acquire(&req("k", RwMode::Write, "w", 100), None, &fence),
        )
        .await;
        assert!(waited.is_err());
        assert!(t
            .try_acquire(&req("k", RwMode::Read, "x", 100), &fence)
            .is_some());
        assert!(t.release(RwMode::Read, &held));
    }
}
