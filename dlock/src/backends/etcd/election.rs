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
//! - Observers watch the directory: every put or delete of a direct child
//!   makes them read the leader again.
//! - The `-election` root keeps these keys out of every plain lock's
//!   directory (`<prefix>/<key>/`), and those out of these. Only the direct
//!   children of the directory count, as for locks (`contenders.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
    WatchStream,
};

use super::client::revision_of_lease;
use super::contenders::{Contenders, PAGE};
use super::queue::{Ahead, Enqueued, Line};
use super::refused::About;
use super::session::Session;
use super::{names, EtcdBackend, Inner};
use crate::backend::{AcquireRequest, ElectionBackend, Leader, LeaderChanges, Lease};
use crate::{deadline, LockError};

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
        self.inner.election_prefix(name)
    }
}

impl Inner {
    pub(super) fn election_prefix(&self, name: &str) -> String {
        format!("{}-election/{}", self.prefix, names::escape(name))
    }

    /// Whether `entry` is an election's candidate key (its release keeps
    /// the election's turn, not a lock's).
    pub(super) fn is_election_entry(&self, entry: &str) -> bool {
        entry
            .strip_prefix(self.prefix.as_str())
            .is_some_and(|rest| rest.starts_with("-election/"))
    }

    /// The leader of the directory `dir`: its direct child with the lowest
    /// create revision, among the first page (deeper keys are another
    /// election's).
    async fn leader_in(&self, dir: &str) -> Result<(Option<Leader>, i64), LockError> {
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
        let leader = line.first_in(&answer).map(|kv| Leader {
            value: String::from_utf8_lossy(kv.value()).into_owned(),
            term: u64::try_from(kv.create_revision()).unwrap_or(0),
        });
        Ok((leader, revision))
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
    req: &'a AcquireRequest,
    value: &'a str,
    /// `<prefix>-election/<escaped name>/`.
    dir: String,
}

#[async_trait]
impl Line for ElectionLine<'_> {
    fn key(&self) -> &str {
        &self.req.key
    }

    fn ttl(&self) -> Duration {
        self.req.ttl
    }

    fn entry(&self, _inner: &Inner, session: &Session) -> String {
        format!("{}{:x}", self.dir, session.id)
    }

    async fn enqueue(
        &self,
        inner: &Inner,
        session: &Session,
        entry: &str,
    ) -> Result<Enqueued, LockError> {
        inner
            .enqueue_in(&self.dir, self.value, session, entry)
            .await
    }

    async fn ahead(&self, inner: &Inner, entry: &str, mine: i64) -> Result<Ahead, LockError> {
        inner.predecessor_in(&self.dir, entry, mine).await
    }

    fn lease(&self, entry: String, revision: i64, session: &Session) -> Lease {
        Lease {
            key: self.req.key.clone(),
            token: self.req.token.clone(),
            ttl: self.req.ttl,
            fencing_token: Some(revision as u64),
            valid_until: session.deadline(self.req.ttl),
            resource: entry,
        }
    }
}

/// One observer's watch of an election's directory.
struct Changes {
    inner: Arc<Inner>,
    dir: String,
    stream: Option<WatchStream>,
    /// The store revision seen last: a new watch starts after it.
    revision: i64,
}

#[async_trait]
impl LeaderChanges for Changes {
    async fn changed(&mut self) -> bool {
        loop {
            let stream = match self.stream.as_mut() {
                Some(stream) => stream,
                None => match self.inner.watch_dir(&self.dir, self.revision).await {
                    Ok(stream) => self.stream.insert(stream),
                    Err(e) => {
                        tracing::debug!(error = %e, dir = %self.dir, "watching an etcd election failed; trying again in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        // Changes may have been missed: read again.
                        return true;
                    }
                },
            };
            match stream.message().await {
                Ok(Some(answer)) => {
                    if let Some(header) = answer.header() {
                        self.revision = self.revision.max(header.revision());
                    }
                    let line = Contenders {
                        dir: &self.dir,
                        kinds: Contenders::DIRECT,
                    };
                    if answer.canceled() {
                        self.stream = None;
                        return true;
                    }
                    if answer
                        .events()
                        .iter()
                        .any(|e| e.kv().is_some_and(|kv| line.contains(kv.key())))
                    {
                        return true;
                    }
                }
                Ok(None) | Err(_) => {
                    self.stream = None;
                    return true;
                }
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
        let dir = format!("{}/", inner.election_prefix(&req.key));
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
        let line = ElectionLine { req, value, dir };
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
        let dir = format!("{}/", self.inner.election_prefix(name));
        let answer = self.inner.leader_in(&dir).await;
        answer
            .map(|(leader, _)| leader)
            .map_err(|e| self.inner.name_refusal(e, About::Election(name)))
    }

    async fn watch(&self, name: &str) -> Result<Box<dyn LeaderChanges>, LockError> {
        let inner = &self.inner;
        let dir = format!("{}/", inner.election_prefix(name));
        let (_, revision) = inner
            .leader_in(&dir)
            .await
            .map_err(|e| inner.name_refusal(e, About::Election(name)))?;
        let stream = inner
            .watch_dir(&dir, revision)
            .await
            .map_err(|e| inner.name_refusal(e, About::Election(name)))?;
        Ok(Box::new(Changes {
            inner: inner.clone(),
            dir,
            stream: Some(stream),
            revision,
        }))
    }
}
