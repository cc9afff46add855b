//! Read-write locks on etcd, in the layout and by the rules of etcd's own
//! recipe `RWMutex` (`client/v3/experimental/recipes`), so that a Go
//! service using `recipe.NewRWMutex(session, "<prefix>-rw/<escaped key>")`
//! and dlock's `RwLock` on the key exclude each other.
//!
//! - A reader or writer, waiting or holding, is the key
//!   `<prefix>-rw/<escaped key>/read/<n>` or `.../write/<n>`, `<n>` the
//!   nanoseconds since the Unix epoch (the recipe's name), with an empty
//!   value, on the backend's session lease for the ttl. It is created by a
//!   transaction `If(Version(key) == 0)`; a name that exists on another
//!   client's lease (it picked the same nanosecond) is never touched, a new
//!   one is picked. An enqueue that went unanswered is asked again under
//!   the same name, so that if the first one lands late it is found (on our
//!   own session) and replaced, never left ahead of us in line.
//! - The create revision is the place in line. A reader waits for the
//!   `write` key with the largest mod revision below its own revision to be
//!   deleted, a writer for the key of either kind with the largest mod
//!   revision below its own (the recipe's `WithLastRev` +
//!   `WithMaxModRev(myRev - 1)`), each by a watch of that one key's delete;
//!   then it reads again. The first read is in the creating transaction.
//! - The fencing token is the own key's create revision, for readers and
//!   writers alike (see the module docs of `etcd.rs` for why it orders
//!   reads between writes).
//! - The `-rw` root keeps these keys out of every plain lock's directory
//!   (`<prefix>/<key>/`), and those out of these.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::client::revision_of;
use super::contenders::{get_of, Contenders};
use super::names::Kind;
use super::queue::{Ahead, Asked, Enqueued, Line, STALE_TRIES};
use super::refused::About;
use super::session::Session;
use super::{EtcdBackend, Inner};
use crate::backend::{Lease, Renewal, RwBackend, RwMode, RwRequest};
use crate::LockError;

impl EtcdBackend {
    /// The prefix of the read-write lock of `key` (`<prefix>-rw/<escaped
    /// key>`): a Go service with `recipe.NewRWMutex(session, prefix)` on it
    /// takes the same read-write lock, and `etcdctl get --prefix` on it plus
    /// `/` lists its readers and writers. It is apart from the plain lock
    /// of `key` ([`queue_prefix`](EtcdBackend::queue_prefix)).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let etcd = dlock::backends::etcd::EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
    /// assert_eq!(etcd.rw_prefix("prices"), "dlock-rw/prices");
    /// assert_eq!(etcd.rw_prefix("prices/eu"), "dlock-rw/prices%2Feu");
    /// # Ok(()) }
    /// ```
    pub fn rw_prefix(&self, key: &str) -> String {
        self.inner.prefix_of(Kind::Rw, key)
    }
}

impl Inner {
    /// Takes a `req.mode` lease (`once`: only if nothing is in its way now),
    /// waiting at most until `deadline`. No turn is needed: every entry has
    /// a name of its own.
    async fn acquire_rw(
        self: &Arc<Self>,
        req: &RwRequest,
        deadline: Option<Instant>,
        once: bool,
    ) -> Result<Option<Lease>, LockError> {
        let line = RwLine {
            inner: self,
            req,
            dir: format!("{}/", self.prefix_of(Kind::Rw, &req.key)),
        };
        self.join(&line, None, deadline, once).await
    }
}

/// The last `<n>` this process gave an entry.
static LAST_NAME: AtomicU64 = AtomicU64::new(0);

/// The `<n>` of a new entry: the nanoseconds since the Unix epoch, as the
/// recipe names its keys, made larger than the last one this process gave
/// so that two entries of one process never pick one name (the clock's
/// resolution may be coarser than a nanosecond, and it may step back).
fn clock_name() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let previous = LAST_NAME
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(now.max(last.saturating_add(1)))
        })
        .unwrap_or(now);
    now.max(previous.saturating_add(1))
}

/// The line of one read-write lock request.
struct RwLine<'a> {
    inner: &'a Inner,
    req: &'a RwRequest,
    /// `<prefix>-rw/<escaped key>/`.
    dir: String,
}

impl RwLine<'_> {
    /// The keys in our way: every `write/<n>` for a reader (the recipe
    /// reads `pfx + "write"`), every `read/<n>` and `write/<n>` for a
    /// writer (the recipe: every key under the prefix). A deeper key
    /// (`<dir>eu/write/<n>`, another lock's) is never one (`contenders.rs`).
    fn in_the_way(&self) -> Contenders<'_> {
        Contenders {
            dir: &self.dir,
            kinds: match self.req.mode {
                RwMode::Read => &["write/"],
                RwMode::Write => &["read/", "write/"],
            },
        }
    }
}

#[async_trait]
impl Line for RwLine<'_> {
    fn asked(&self) -> Asked<'_> {
        Asked::of_rw(self.req)
    }

    fn entry(&self, _session: &Session) -> String {
        format!("{}{}/{}", self.dir, self.req.mode.as_str(), clock_name())
    }

    /// The read of the keys in our way comes before the put in the
    /// transaction: it sees exactly the keys older than ours (all of them
    /// have a mod revision below the transaction's, which is ours).
    ///
    /// A name that exists already on one of our sessions is this
    /// acquisition's own earlier enqueue, cut off in flight and applied
    /// late (`take` asks again under the same name when an enqueue went
    /// unanswered): left there, it would stand ahead of our new entry for
    /// as long as the session lives. It is deleted by its revision and ours
    /// created anew, as a plain lock's stale key is (`mutex.rs`). A name on
    /// another client's lease is never touched.
    async fn enqueue(&self, session: &Session, entry: &str) -> Result<Enqueued, LockError> {
        let inner = self.inner;
        let txn = Txn::new()
            .when([Compare::version(entry, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::get(
                    self.in_the_way().prefix(),
                    Some(Contenders::page(SortTarget::Mod, SortOrder::Descend, None)),
                ),
                TxnOp::put(entry, "", Some(PutOptions::new().with_lease(session.id))),
            ])
            .or_else([TxnOp::get(entry, None)]);
        let mut stale_tries = 0;
        let answer = loop {
            let answer = inner.txn(txn.clone()).await?;
            if answer.succeeded() {
                break answer;
            }
            let existing = get_of(answer.op_responses().first())
                .and_then(|get| get.kvs().first())
                .map(|kv| (kv.create_revision(), kv.lease()));
            match existing {
                // Gone since the compare: ask again.
                None => {}
                Some((revision, lease)) if lease == session.id => {
                    inner.delete_entry(entry, Some(revision)).await?;
                }
                Some(_) => return Ok(Enqueued::Taken),
            }
            stale_tries += 1;
            if stale_tries >= STALE_TRIES {
                return Err(inner.error(format!(
                    "the queue entry `{entry}` stayed taken by an older key of this backend"
                )));
            }
        };
        let Some(mine) = revision_of(&answer) else {
            return Err(inner.error(format!(
                "etcd answered the creation of `{entry}` without its revision"
            )));
        };
        let ops = answer.op_responses();
        let Some(page) = get_of(ops.first()) else {
            return Err(inner.error(format!(
                "etcd answered the creation of `{entry}` without the read of `{}`",
                self.in_the_way().prefix()
            )));
        };
        // The recipe's `WithLastRev`, skipping deeper keys: a page of
        // those alone is read on by `ahead`.
        let first = if self.in_the_way().first_in(page).is_some() {
            false
        } else if page.more() {
            matches!(self.ahead(entry, mine).await?, Ahead::First)
        } else {
            true
        };
        Ok(Enqueued::Created { mine, first })
    }

    async fn ahead(&self, entry: &str, mine: i64) -> Result<Ahead, LockError> {
        // The recipe's `WithLastRev` + `WithMaxModRev(myRev - 1)`.
        self.inner
            .read_ahead(self.in_the_way(), SortTarget::Mod, entry, mine)
            .await
    }
}

#[async_trait]
impl RwBackend for EtcdBackend {
    async fn try_acquire_rw(&self, req: &RwRequest) -> Result<Option<Lease>, LockError> {
        let answer = self.inner.acquire_rw(req, None, true).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Rw(&req.key)))
    }

    async fn acquire_rw(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let answer = self.inner.acquire_rw(req, deadline, false).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Rw(&req.key)))
    }

    /// Read-write keys are session keys like lock keys: the same
    /// keep-alive, and the same read of each key by its create revision.
    async fn renew_rw(&self, _mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let renewed = self.renew_any(leases).await;
        self.inner.name_refusals(leases, renewed, About::Rw)
    }

    /// Deletes the key if its create revision is still ours; if etcd fails
    /// or this future is dropped first, the delete goes on in the
    /// background (see `held.rs`). No turn: the name is never reused.
    async fn release_rw(&self, _mode: RwMode, lease: &Lease) -> Result<bool, LockError> {
        let answer = self.inner.release_entry(lease, None).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Rw(&lease.key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_names_are_nanoseconds_and_never_repeat_in_a_process() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let names: Vec<u64> = (0..1000).map(|_| clock_name()).collect();
        assert!(names[0] >= before, "{} < {before}", names[0]);
        assert!(names.windows(2).all(|w| w[0] < w[1]), "a name repeated");
        // Within a few seconds of the clock: a Go reader of the name sees a time.
        assert!(names[999] - before < 5_000_000_000);
    }
}
