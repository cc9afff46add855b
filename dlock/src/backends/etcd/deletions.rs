//! Noticing held keys deleted behind our back, for many keys at once: one
//! watch of the namespace's deletes instead of a read of every held key at
//! every renewal.
//!
//! A renewal must prove that each held key still exists (a live session
//! lease does not: `etcdctl del` removes a key and leaves its lease). With a
//! few keys, one read does it. With tens of thousands, the reads (one
//! transaction per 64 keys, each linearizable) queue behind every write the
//! server has to apply first, and while many keys are being taken renewals
//! missed their deadlines: 50,000 held keys were not held on a 2-core
//! machine.
//!
//! Past [`WATCHED_FROM`] keys in one renewal, the backend instead keeps one
//! watch stream with a watcher per key root that holds keys when it starts
//! (`<prefix>/`, `-rw/`, `-semaphores/`, `-election/`: the roots a
//! least-privilege role may read, and only those in use, so a role without
//! elections is not refused a watch of them), with puts filtered out,
//! started at the smallest create revision of the keys held then. Each
//! delete of a held key's name after its create revision marks the record
//! deleted (`Held::deleted`). A renewal then sends one progress request on
//! the stream: etcd answers it once every event up to its current revision
//! has been sent, and the stream delivers in order, so when the answer
//! arrives every delete committed before the renewal began has been marked.
//! A key is present if its record is there, at its revision, unmarked.
//!
//! What the watch cannot vouch for is read as before:
//! - keys created before the watch's start revision (a waiter's key made
//!   long before it was granted, after the watch started), and keys under
//!   a root the watch does not cover (the first election of a backend
//!   whose watch runs): read one by one;
//! - the whole renewal when the watch is not there or does not answer
//!   within the request timeout (a broken stream, a start revision already
//!   compacted, a refused watch): read, and the next renewal starts a watch
//!   again, unless its start revision is known to be compacted.
//!
//! The watch closes after [`IDLE`] without a renewal asking it, so a
//! backend that held many keys once does not receive every delete of the
//! namespace for ever.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::client::revision_of_lease;
use super::names::Kind;
use super::{lock, Inner};
use crate::backend::Lease;
use crate::LockError;

/// From this many keys in one renewal on, their presence is checked by the
/// watch: fewer are one or two reads, as cheap as the progress request.
pub(super) const WATCHED_FROM: usize = 128;

/// How long the watch stays open with no renewal asking it.
const IDLE: Duration = Duration::from_secs(10);

/// The watch, while it runs, and what is known about starting one.
#[derive(Default)]
pub(super) struct DeleteWatch {
    running: Option<Running>,
    /// A watch from a revision below this was refused as compacted: start
    /// none until every held key is younger.
    compacted_below: i64,
}

/// A running watch: the revision it started at, the key roots it covers,
/// and where a renewal asks for a progress answer.
struct Running {
    covers: Arc<Covered>,
    asks: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

/// What a watch vouches for: keys created at or after `start` under one of
/// `roots`.
pub(super) struct Covered {
    start: i64,
    roots: Vec<String>,
}

impl Covered {
    fn covers(&self, lease: &Lease, revision: i64) -> bool {
        revision >= self.start && self.roots.iter().any(|r| lease.resource.starts_with(r))
    }
}

impl Inner {
    /// The create revision of each lease's key (`None`: the key is gone),
    /// as of a moment after this call began: by the watch of deletes for
    /// many keys, by reads for a few (see the module docs).
    pub(super) async fn present_revisions(
        self: &Arc<Self>,
        leases: &[Lease],
    ) -> Result<Vec<Option<i64>>, LockError> {
        if leases.len() < WATCHED_FROM {
            return self.read_revisions(leases).await;
        }
        let Some((covered, answered)) = self.ask_watch().await else {
            return self.read_revisions(leases).await;
        };
        match tokio::time::timeout(self.timeout, answered).await {
            Ok(Ok(())) => {}
            // No progress answer in time, or the watch ended: read instead.
            _ => return self.read_revisions(leases).await,
        }
        let mut present: Vec<Option<i64>> = Vec::with_capacity(leases.len());
        let mut unwatched: Vec<(usize, Lease)> = Vec::new();
        {
            let held = lock(&self.held);
            for (i, lease) in leases.iter().enumerate() {
                let revision = revision_of_lease(lease);
                match revision {
                    Some(r) if !covered.covers(lease, r) => {
                        unwatched.push((i, lease.clone()));
                        present.push(None);
                    }
                    _ => present.push(
                        held.get(&lease.resource)
                            .filter(|h| Some(h.revision) == revision && !h.deleted)
                            .map(|h| h.revision),
                    ),
                }
            }
        }
        if !unwatched.is_empty() {
            let (at, older): (Vec<usize>, Vec<Lease>) = unwatched.into_iter().unzip();
            let read = self.read_revisions(&older).await?;
            for (i, revision) in at.into_iter().zip(read) {
                present[i] = revision;
            }
        }
        Ok(present)
    }

    /// Asks the running watch for a progress answer, starting a watch if
    /// none runs: what it covers and the answer to wait for. `None`: no
    /// watch can vouch now (nothing held, a compacted start, a refused
    /// watch).
    async fn ask_watch(self: &Arc<Self>) -> Option<(Arc<Covered>, oneshot::Receiver<()>)> {
        let mut watch = self.delete_watch.lock().await;
        let (tx, rx) = oneshot::channel();
        let tx = match &watch.running {
            Some(running) => match running.asks.send(tx) {
                Ok(()) => return Some((running.covers.clone(), rx)),
                // The task ended (stream broken, cancelled, idle).
                Err(mpsc::error::SendError(tx)) => tx,
            },
            None => tx,
        };
        watch.running = None;
        let candidates = Kind::ALL.map(|kind| self.root(kind));
        let (start, roots) = {
            let held = lock(&self.held);
            let start = held.values().map(|h| h.revision).min()?;
            let roots: Vec<String> = candidates
                .into_iter()
                .filter(|root| held.keys().any(|key| key.starts_with(root.as_str())))
                .collect();
            (start, roots)
        };
        if start < watch.compacted_below {
            return None;
        }
        let stream = match self.open_watch(start, &roots).await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "no watch of deletes; renewal reads every key");
                return None;
            }
        };
        let (asks, asked) = mpsc::unbounded_channel();
        let covers = Arc::new(Covered { start, roots });
        let running = Running {
            covers: covers.clone(),
            asks,
        };
        running.asks.send(tx).ok()?;
        watch.running = Some(running);
        crate::lease::background::spawn_daemon(follow(Arc::downgrade(self), stream, asked, start));
        Some((covers, rx))
    }

    /// One stream, a watcher per root: the deletes under each, from `start`
    /// on.
    async fn open_watch(&self, start: i64, roots: &[String]) -> Result<WatchStream, LockError> {
        let options = || {
            WatchOptions::new()
                .with_prefix()
                .with_start_revision(start)
                .with_filters([WatchFilterType::NoPut])
        };
        let Some((first, rest)) = roots.split_first() else {
            return Err(self.error("no held key under the backend's roots"));
        };
        let mut client = self.client.watch_client();
        let opened = tokio::time::timeout(self.timeout, async {
            let mut stream = client.watch(first.as_str(), Some(options())).await?;
            for root in rest {
                stream.watch(root.as_str(), Some(options())).await?;
            }
            Ok::<_, etcd_client::Error>(stream)
        })
        .await;
        match opened {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(self.error(e)),
            Err(_) => Err(self.error(format!("no watch within {:?}", self.timeout))),
        }
    }

    /// Marks every held key whose name one of `events` deleted after the
    /// key was created.
    fn note_deletes(&self, answer: &WatchResponse) {
        let mut held = lock(&self.held);
        for event in answer.events() {
            if event.event_type() != EventType::Delete {
                continue;
            }
            let Some(kv) = event.kv() else { continue };
            let Ok(key) = kv.key_str() else { continue };
            if let Some(h) = held.get_mut(key)
                && h.revision < kv.mod_revision()
            {
                h.deleted = true;
            }
        }
    }
}

/// The watch task: marks deletes, sends a progress request for each batch
/// of asks and answers them in order, and ends when the stream does, when
/// the backend is gone, or after [`IDLE`] without an ask.
async fn follow(
    inner: Weak<Inner>,
    mut stream: WatchStream,
    mut asks: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    start: i64,
) {
    // Asks whose progress request went out, oldest first. etcd answers
    // progress requests in order, and may skip one while a watcher catches
    // up; the k-th answer therefore comes at or after the k-th request, so
    // it vouches for every ask sent before that request.
    let mut sent: VecDeque<Vec<oneshot::Sender<()>>> = VecDeque::new();
    let mut idle_until = Instant::now() + IDLE;
    loop {
        let mut asked = Vec::new();
        tokio::select! {
            ask = asks.recv() => match ask {
                Some(tx) => {
                    asked.push(tx);
                    while let Ok(tx) = asks.try_recv() {
                        asked.push(tx);
                    }
                    idle_until = Instant::now() + IDLE;
                }
                None => return,
            },
            message = stream.message() => {
                let Ok(Some(answer)) = message else { return };
                let Some(inner) = inner.upgrade() else { return };
                if answer.canceled() {
                    if answer.compact_revision() > 0 {
                        let mut watch = inner.delete_watch.lock().await;
                        watch.compacted_below = watch.compacted_below.max(answer.compact_revision());
                    }
                    tracing::debug!(start, reason = answer.cancel_reason(), "watch of deletes cancelled");
                    return;
                }
                if !answer.events().is_empty() {
                    inner.note_deletes(&answer);
                } else if !answer.created() {
                    // A progress answer: everything up to its revision was sent.
                    if let Some(group) = sent.pop_front() {
                        for tx in group {
                            let _ = tx.send(());
                        }
                    }
                }
            },
            _ = tokio::time::sleep_until(idle_until), if sent.is_empty() => return,
        }
        if !asked.is_empty() {
            if stream.request_progress().await.is_err() {
                return;
            }
            sent.push_back(asked);
        }
    }
}
