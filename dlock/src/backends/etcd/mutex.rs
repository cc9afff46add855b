//! The mutex's line: one entry per session under the key's directory
//! (`<prefix>/<escaped key>/<lease-hex>`, the layout of `etcdctl lock`),
//! held by the oldest entry by create revision, each waiter behind the
//! youngest entry older than its own.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::client::{first_create_revision, revision_of};
use super::contenders::{get_of, Contenders};
use super::queue::{Ahead, Asked, Enqueued, Line, STALE_TRIES};
use super::session::Session;
use super::Inner;
use crate::backend::{AcquireRequest, Lease};
use crate::{backend::deadline, LockError};

/// The line of a plain lock: `try_acquire` and `acquire` wait in it.
struct MutexLine<'a> {
    inner: &'a Inner,
    req: &'a AcquireRequest,
}

#[async_trait]
impl Line for MutexLine<'_> {
    fn asked(&self) -> Asked<'_> {
        Asked::of(self.req)
    }

    fn entry(&self, session: &Session) -> String {
        self.inner.entry_of(&self.req.key, session.id)
    }

    async fn enqueue(&self, session: &Session, entry: &str) -> Result<Enqueued, LockError> {
        self.inner.enqueue(&self.req.key, session, entry).await
    }

    async fn ahead(&self, entry: &str, mine: i64) -> Result<Ahead, LockError> {
        self.inner.predecessor(&self.req.key, entry, mine).await
    }
}

impl Inner {
    /// Takes the lock of `req.key` (`once`: only if it is free now), waiting
    /// at most until `deadline`.
    ///
    /// The key's turn (see [`Inner::turns`]) is held from here until the
    /// entry holds the lock or is gone from the server: the next
    /// acquisition of the key waits in the core until the guard lets go, and
    /// a release takes the turn again while its delete is on its way.
    pub(super) async fn acquire(
        self: &Arc<Self>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        once: bool,
    ) -> Result<Option<Lease>, LockError> {
        let turn = if once {
            match self.try_turn(&req.key) {
                Some(turn) => turn,
                // This backend already holds or queues for the key.
                None => return Ok(None),
            }
        } else {
            match deadline::until(deadline, self.turn(&req.key)).await {
                Some(turn) => turn,
                None => return Ok(None),
            }
        };
        let line = MutexLine { inner: self, req };
        self.join(&line, Some(turn), deadline, once).await
    }

    /// Enqueues under `session`: creates our key, and reads the holder in the
    /// same transaction.
    ///
    /// If a key of that name exists already, it is an older key of our
    /// session: a release or cleanup whose delete has not landed (or never
    /// will), or an enqueue cut off in flight. It is never adopted: its
    /// revision was another guard's fencing token, and a delete of that
    /// revision may still arrive and would take the key from under us. It
    /// is deleted by its revision, and ours created anew.
    pub(super) async fn enqueue(
        &self,
        key: &str,
        session: &Session,
        entry: &str,
    ) -> Result<Enqueued, LockError> {
        self.enqueue_in(&self.dir_of(key), &self.client_name, session, entry)
            .await
    }

    /// [`enqueue`](Self::enqueue) in the directory `dir`, with `value`: a
    /// plain lock's (the client name) or an election's (the candidate's
    /// value, `election.rs`).
    pub(super) async fn enqueue_in(
        &self,
        dir: &str,
        value: &str,
        session: &Session,
        entry: &str,
    ) -> Result<Enqueued, LockError> {
        let line = Contenders {
            dir,
            kinds: Contenders::DIRECT,
        };
        let owner = TxnOp::get(
            dir,
            Some(Contenders::page(
                SortTarget::Create,
                SortOrder::Ascend,
                None,
            )),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(entry, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(entry, value, Some(PutOptions::new().with_lease(session.id))),
                owner,
            ])
            .or_else([TxnOp::get(entry, None)]);
        for _ in 0..STALE_TRIES {
            let answer = self.txn(txn.clone()).await?;
            let ops = answer.op_responses();
            if answer.succeeded() {
                let Some(mine) = revision_of(&answer) else {
                    return Err(self.error(format!(
                        "etcd answered the enqueue of `{entry}` without its revision"
                    )));
                };
                // The oldest entry, skipping deeper keys (another
                // resource's, see `contenders.rs`); ours is among the
                // first page unless deeper keys filled it.
                let first = match get_of(ops.get(1)).and_then(|page| line.first_in(page)) {
                    Some(owner) => owner.create_revision() == mine,
                    None => matches!(self.predecessor_in(dir, entry, mine).await?, Ahead::First),
                };
                return Ok(Enqueued::Created { mine, first });
            }
            // Gone since: try again.
            let Some(stale) = first_create_revision(ops.first()) else {
                continue;
            };
            if let Some(until) = self.live_until(entry, stale) {
                return Ok(Enqueued::HeldHere { until });
            }
            self.delete_entry(entry, Some(stale)).await?;
        }
        Err(self.error(format!(
            "the queue entry `{entry}` stayed taken by an older key of this backend"
        )))
    }

    /// Reads the youngest entry older than ours (by create revision; only
    /// the directory's direct children count), and checks ours still exists.
    pub(super) async fn predecessor(
        &self,
        key: &str,
        entry: &str,
        mine: i64,
    ) -> Result<Ahead, LockError> {
        self.predecessor_in(&self.dir_of(key), entry, mine).await
    }

    /// [`predecessor`](Self::predecessor) in the directory `dir`.
    pub(super) async fn predecessor_in(
        &self,
        dir: &str,
        entry: &str,
        mine: i64,
    ) -> Result<Ahead, LockError> {
        let line = Contenders {
            dir,
            kinds: Contenders::DIRECT,
        };
        self.read_ahead(line, SortTarget::Create, entry, mine).await
    }
}
