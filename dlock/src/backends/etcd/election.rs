//! Leader election on etcd, in the layout and by the rules of etcd's own
//! `concurrency.Election` (`client/v3/concurrency/election.go`), so that
//! `etcdctl elect <prefix>-election/<name> <value>` (or a Go service's
//! `concurrency.NewElection(session, "<prefix>-election/<name>")`) and
//! dlock's `Election::new(name)` compete in one election.
//!
//! - A candidate is the key `<prefix>-election/<escaped name>/<lease-hex>`
//!   (the session lease's id, as `Campaign` names it), whose value is the
//!   candidate's value, on the backend's session lease for the ttl, created
//!   by a transaction `If(CreateRevision(key) == 0)`.
//! - The leader is the candidate with the lowest create revision (`Leader`:
//!   `WithFirstCreate`); a candidate waits for the delete of the youngest
//!   candidate older than itself, and reads again (`waitDeletes`). So this
//!   is the plain lock's line (`mutex.rs`) in another directory, with the
//!   value in place of the client name.
//! - The term is the leader key's create revision (the lease's fencing
//!   token). `Proclaim` puts a new value `If(CreateRevision(key) == term)`,
//!   on the same lease; `Resign` deletes the key (the lease's release).
//! - Observers read the directory's candidates and watch it from that
//!   revision: each put or delete of a direct child updates the candidates,
//!   and a change of the oldest one is announced, so every term is seen,
//!   however short (a full first page that empties falls back to reading).
//! - The `-election` root keeps these keys out of every plain lock's
//!   directory (`<prefix>/<key>/`), and those out of these. Only the direct
//!   children of the directory count, as for locks (`contenders.rs`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchOptions, WatchStream,
};

use super::client::revision_of_lease;
use super::contenders::{Contenders, PAGE};
use super::names::Kind;
use super::queue::{Ahead, Asked, Enqueued, Line};
use super::refused::About;
use super::session::Session;
use super::{EtcdBackend, Inner};
use crate::backend::{AcquireRequest, ElectionBackend, Leader, LeaderChange, LeaderChanges, Lease};
use crate::{backend::deadline, LockError};

impl EtcdBackend {
    /// The prefix of the election `name` (`<prefix>-election/<escaped
    /// name>`): `etcdctl elect` on it campaigns in the same election, and
    /// `etcdctl elect -l` on it shows the leader's value.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let etcd = dlock::backends::etcd::EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
    /// assert_eq!(etcd.election_prefix("scheduler"), "dlock-election/scheduler");
    /// # Ok(()) }
    /// ```
    pub fn election_prefix(&self, name: &str) -> String {
        self.inner.prefix_of(Kind::Election, name)
    }
}

impl Inner {
    /// Whether `entry` is an election's candidate key (its release keeps
    /// the election's turn, not a lock's).
    pub(super) fn is_election_entry(&self, entry: &str) -> bool {
        entry
            .strip_prefix(self.prefix.as_str())
            .is_some_and(|rest| rest.starts_with("-election/"))
    }

    /// The leader of the directory `dir`: its direct child with the lowest
    /// create revision, among the first page (deeper keys are another
    /// election's), and the store revision of the read.
    async fn leader_in(&self, dir: &str) -> Result<(Option<Leader>, i64), LockError> {
        let (candidates, revision) = self.candidates_in(dir).await?;
        Ok((candidates.leader, revision))
    }

    /// The candidates of the directory `dir` (its direct children in the
    /// first page by create revision), and the store revision of the read.
    async fn candidates_in(&self, dir: &str) -> Result<(Candidates, i64), LockError> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(PAGE);
        let answer = self
            .rpc(|| {
                let mut kv = self.client.kv_client();
                let (dir, options) = (dir.to_owned(), options.clone());
                async move { kv.get(dir, Some(options)).await }
            })
            .await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let line = Contenders {
            dir,
            kinds: Contenders::DIRECT,
        };
        let by_key = answer
            .kvs()
            .iter()
            .filter(|kv| line.contains(kv.key()))
            .map(|kv| {
                let value = String::from_utf8_lossy(kv.value()).into_owned();
                (kv.key().to_vec(), (kv.create_revision(), value))
            })
            .collect();
        let mut candidates = Candidates {
            by_key,
            complete: !answer.more(),
            leader: None,
        };
        candidates.leader = candidates.leader();
        Ok((candidates, revision))
    }

    async fn watch_dir(&self, dir: &str, after: i64) -> Result<WatchStream, LockError> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(after + 1);
        self.rpc(|| {
            let mut watches = self.client.watch_client();
            let (dir, options) = (dir.to_owned(), options.clone());
            async move { watches.watch(dir, Some(options)).await }
        })
        .await
    }
}

/// The line of one candidate.
struct ElectionLine<'a> {
    inner: &'a Inner,
    req: &'a AcquireRequest,
    value: &'a str,
    /// `<prefix>-election/<escaped name>/`.
    dir: String,
}

#[async_trait]
impl Line for ElectionLine<'_> {
    fn asked(&self) -> Asked<'_> {
        Asked::of(self.req)
    }

    fn entry(&self, session: &Session) -> String {
        format!("{}{:x}", self.dir, session.id)
    }

    async fn enqueue(&self, session: &Session, entry: &str) -> Result<Enqueued, LockError> {
        let Self {
            inner, dir, value, ..
        } = self;
        inner.enqueue_in(dir, value, session, entry).await
    }

    async fn ahead(&self, entry: &str, mine: i64) -> Result<Ahead, LockError> {
        self.inner.predecessor_in(&self.dir, entry, mine).await
    }
}

/// One observer's watch of an election's directory, and the candidates it
/// knows from it: the leader is the oldest, so each event says who leads
/// after it, and every term is announced however short.
struct Changes {
    inner: Arc<Inner>,
    dir: String,
    stream: Option<WatchStream>,
    /// The candidates seen, or `None` while they are not known (the first
    /// page of the directory was full and has emptied: the next candidate
    /// is not in view; each event is then `Unknown`).
    candidates: Option<Candidates>,
    /// Changes found and not yet answered.
    found: VecDeque<LeaderChange>,
}

/// The direct children of an election's directory: key → (create
/// revision, value).
struct Candidates {
    by_key: HashMap<Vec<u8>, (i64, String)>,
    /// Whether every candidate is here (the first read was not cut at a page).
    complete: bool,
    /// The leader announced last.
    leader: Option<Leader>,
}

impl Candidates {
    fn leader(&self) -> Option<Leader> {
        self.by_key
            .values()
            .min_by_key(|(revision, _)| *revision)
            .map(|(revision, value)| Leader {
                value: value.clone(),
                term: u64::try_from(*revision).unwrap_or(0),
            })
    }
}

impl Changes {
    /// Reads the candidates and watches the directory from right after
    /// that read.
    async fn start(&mut self) -> Result<(), LockError> {
        let (candidates, revision) = self.inner.candidates_in(&self.dir).await?;
        self.stream = Some(self.inner.watch_dir(&self.dir, revision).await?);
        self.candidates = Some(candidates);
        Ok(())
    }

    /// Applies one watch event: the change of leader it makes, if any.
    fn apply(&mut self, event: &etcd_client::Event) -> Option<LeaderChange> {
        let kv = event.kv()?;
        let line = Contenders {
            dir: &self.dir,
            kinds: Contenders::DIRECT,
        };
        if !line.contains(kv.key()) {
            return None;
        }
        let Some(candidates) = self.candidates.as_mut() else {
            return Some(LeaderChange::Unknown);
        };
        match event.event_type() {
            EventType::Put => {
                let value = String::from_utf8_lossy(kv.value()).into_owned();
                candidates
                    .by_key
                    .insert(kv.key().to_vec(), (kv.create_revision(), value));
            }
            EventType::Delete => {
                candidates.by_key.remove(kv.key());
            }
        }
        let now = candidates.leader();
        if now == candidates.leader {
            return None;
        }
        let before = std::mem::replace(&mut candidates.leader, now.clone());
        match (now, before) {
            (Some(now), _) => Some(LeaderChange::Elected(now)),
            (None, _) if !candidates.complete => {
                // Candidates beyond the first page may exist: no longer known.
                self.candidates = None;
                Some(LeaderChange::Unknown)
            }
            (None, Some(before)) => Some(LeaderChange::Ended { term: before.term }),
            (None, None) => None,
        }
    }
}

#[async_trait]
impl LeaderChanges for Changes {
    async fn changed(&mut self) -> LeaderChange {
        loop {
            if let Some(change) = self.found.pop_front() {
                return change;
            }
            let Some(stream) = self.stream.as_mut() else {
                if let Err(e) = self.start().await {
                    tracing::debug!(error = %e, dir = %self.dir, "watching an etcd election failed; trying again in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                // Changes may have been missed: read again.
                return LeaderChange::Unknown;
            };
            match stream.message().await {
                Ok(Some(answer)) if !answer.canceled() => {
                    for event in answer.events() {
                        if let Some(change) = self.apply(event) {
                            self.found.push_back(change);
                        }
                    }
                }
                // Cancelled (compacted past its start, or refused), ended
                // or broken: start again from a fresh read.
                Ok(_) | Err(_) => self.stream = None,
            }
        }
    }
}

#[async_trait]
impl ElectionBackend for EtcdBackend {
    fn own_layout(&self) -> bool {
        true
    }

    async fn campaign(
        &self,
        req: &AcquireRequest,
        value: &str,
        deadline: Option<Instant>,
        once: bool,
    ) -> Result<Option<Lease>, LockError> {
        let inner = &self.inner;
        let dir = format!("{}/", inner.prefix_of(Kind::Election, &req.key));
        // The election's own turn (its directory), apart from the plain
        // lock of the same name: one request of this backend at a time for
        // its candidate key.
        let turn = if once {
            match inner.try_turn(&dir) {
                Some(turn) => turn,
                None => return Ok(None),
            }
        } else {
            match deadline::until(deadline, inner.turn(&dir)).await {
                Some(turn) => turn,
                None => return Ok(None),
            }
        };
        let line = ElectionLine {
            inner,
            req,
            value,
            dir,
        };
        let answer = inner.join(&line, Some(turn), deadline, once).await;
        answer.map_err(|e| inner.name_refusal(e, About::Election(&req.key)))
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool, LockError> {
        let inner = &self.inner;
        let Some(term) = revision_of_lease(lease) else {
            return Ok(false);
        };
        let Some(session) = lease
            .resource
            .rsplit('/')
            .next()
            .and_then(|hex| i64::from_str_radix(hex, 16).ok())
        else {
            return Ok(false);
        };
        let entry = lease.resource.as_str();
        let txn = Txn::new()
            .when([Compare::create_revision(entry, CompareOp::Equal, term)])
            .and_then([TxnOp::put(
                entry,
                value,
                Some(PutOptions::new().with_lease(session)),
            )]);
        let answer = inner
            .txn(txn)
            .await
            .map_err(|e| inner.name_refusal(e, About::Election(&lease.key)))?;
        Ok(answer.succeeded())
    }

    /// Nothing: the release deletes the candidate key, which is what
    /// observers (and Go's `Observe`) see.
    async fn withdraw(&self, _lease: &Lease) -> Result<(), LockError> {
        Ok(())
    }

    async fn leader(&self, name: &str) -> Result<Option<Leader>, LockError> {
        let dir = format!("{}/", self.inner.prefix_of(Kind::Election, name));
        let answer = self.inner.leader_in(&dir).await;
        answer
            .map(|(leader, _)| leader)
            .map_err(|e| self.inner.name_refusal(e, About::Election(name)))
    }

    async fn watch(&self, name: &str) -> Result<Box<dyn LeaderChanges>, LockError> {
        let inner = &self.inner;
        let mut changes = Changes {
            inner: inner.clone(),
            dir: format!("{}/", inner.prefix_of(Kind::Election, name)),
            stream: None,
            candidates: None,
            found: VecDeque::new(),
        };
        changes
            .start()
            .await
            .map_err(|e| inner.name_refusal(e, About::Election(name)))?;
        Ok(Box::new(changes))
    }
}
