//! Waiting in line, for a plain lock (`mutex.rs`) and a read-write lock
//! (`rw.rs`) alike: enqueue (create our key and read what is in its way in
//! one transaction), wait for that key's delete by a watch, and delete an
//! entry that did not become the lock (timed out, cancelled).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchStream,
};
use tokio::sync::OwnedMutexGuard;

use super::client::{first_create_revision, lease_not_found, revision_of};
use super::contenders::{get_of, revision, Contenders};
use super::session::{after, Alive, Session};
use super::{lock, Inner};
use crate::backend::{AcquireRequest, Lease, RwRequest};
use crate::{backend::deadline, LockError};

/// How many times an acquire starts over because its session lease vanished
/// under it before it reports an error: more means etcd keeps expiring
/// leases faster than we can use them.
pub(super) const MAX_REQUEUES: u32 = 5;

/// How many times an enqueue deletes an older key that holds its entry name
/// before it gives up (one is the rule; more means an enqueue cut off in
/// flight landed late).
pub(super) const STALE_TRIES: u32 = 4;

/// A lock key's turn within this backend (see [`Inner::turns`]).
pub(super) struct Turn {
    pub(super) guard: Option<OwnedMutexGuard<()>>,
    pub(super) key: String,
    pub(super) inner: Arc<Inner>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = lock(&self.inner.turns);
        // Forget the key's mutex once nobody holds or waits for it, so a
        // process that locks many distinct keys does not keep them all.
        if turns
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            turns.remove(&self.key);
        }
    }
}

/// How an acquisition's talk with etcd stands, for when its deadline passes.
#[derive(Default)]
pub(super) struct Progress {
    /// The latest error, cleared by the next answer.
    pub(super) failure: Option<LockError>,
    /// A request to etcd has been unanswered since then.
    pub(super) asking_since: Option<Instant>,
}

/// A request unanswered this long when the deadline passes means etcd is not
/// answering (a paused or partitioned member), not that the lock is busy;
/// one unanswered for less is asked about with a read
/// ([`Inner::answers_a_read`]).
pub(super) const STALLED: Duration = Duration::from_secs(1);

impl Progress {
    pub(super) fn answered(&mut self) {
        self.failure = None;
        self.asking_since = None;
    }

    /// What `acquire` returns when its deadline passed: a timeout, unless
    /// etcd was failing or silent, which is a backend error. With a request
    /// in flight, however short the wait: silent for [`STALLED`], or not
    /// answering a read either, is an outage (`backend/silence.rs`).
    pub(super) async fn at_deadline(self, inner: &Inner) -> Result<Option<Lease>, LockError> {
        match (self.failure, self.asking_since) {
            (Some(e), _) => Err(e),
            (None, Some(since)) if since.elapsed() >= STALLED => {
                Err(inner.silent_at_deadline(Some(since.elapsed())))
            }
            (None, Some(since)) => {
                if inner.answers_a_read().await {
                    Ok(None)
                } else {
                    Err(inner.silent_at_deadline(Some(since.elapsed())))
                }
            }
            _ => Ok(None),
        }
    }
}

/// What a waiter found ahead of its entry.
pub(super) enum Ahead {
    /// Nothing older: the lock is ours.
    First,
    /// The youngest older entry (raw bytes: other clients may write any key),
    /// and the store revision of the read that found it.
    Behind { key: Vec<u8>, revision: i64 },
    /// Our own entry is gone.
    Gone,
}

/// What an enqueue found.
pub(super) enum Enqueued {
    /// Our key, created at `mine`; `first`: nothing is in its way.
    Created { mine: i64, first: bool },
    /// A guard of this backend still counts on the key of our name, until
    /// `until`. The core lets one local holder of a key in at a time, so
    /// this is at most the last moment of a lease being lost: the caller
    /// lets it end rather than take its key away.
    HeldHere { until: Instant },
    /// Another client's key has the name we picked (read-write entries are
    /// named by a clock, as etcd's recipe names them): pick another.
    Taken,
}

/// How many names an enqueue tries before it gives up, when each one it
/// picks turns out to be another client's key.
const NAME_TRIES: u32 = 8;

/// One kind of line a waiter stands in: the plain lock's (`mutex.rs`) or a
/// read-write lock's (`rw.rs`). A line says how an entry is named and
/// created and what stands in its way; [`Inner::take`] and [`Inner::join`]
/// do the rest for both: sessions, retries, watching, cleaning up.
#[async_trait]
pub(super) trait Line: Sync {
    /// What each entry of this line asks for: the caller's lock key (also
    /// for messages), owner token and lease length.
    fn asked(&self) -> Asked<'_>;

    /// The name of our next entry on `session`.
    fn entry(&self, session: &Session) -> String;

    /// Creates `entry` on `session` unless the name exists, and reads in
    /// the same transaction whether an older entry is in its way.
    async fn enqueue(&self, session: &Session, entry: &str) -> Result<Enqueued, LockError>;

    /// The youngest entry in the way of ours (created at `mine`), or that
    /// ours is first or gone.
    async fn ahead(&self, entry: &str, mine: i64) -> Result<Ahead, LockError>;

    /// The lease of a won entry: its fencing token is the create revision,
    /// its record the entry, its life the session's.
    fn lease(&self, entry: String, revision: i64, session: &Session) -> Lease {
        let asked = self.asked();
        Lease {
            key: asked.key.to_owned(),
            token: asked.token.to_owned(),
            ttl: asked.ttl,
            fencing_token: Some(revision as u64),
            valid_until: session.deadline(asked.ttl),
            resource: entry,
        }
    }
}

/// What a line's entries ask for (a plain, read-write or election request).
pub(super) struct Asked<'a> {
    pub(super) key: &'a str,
    pub(super) token: &'a str,
    pub(super) ttl: Duration,
}

impl<'a> Asked<'a> {
    /// A plain lock's or an election's request.
    pub(super) fn of(req: &'a AcquireRequest) -> Self {
        Asked {
            key: &req.key,
            token: &req.token,
            ttl: req.ttl,
        }
    }

    /// A read-write lock's request.
    pub(super) fn of_rw(req: &'a RwRequest) -> Self {
        Asked {
            key: &req.key,
            token: &req.token,
            ttl: req.ttl,
        }
    }
}

/// An entry that became the lock.
pub(super) struct Won {
    entry: String,
    revision: i64,
    session: Arc<Session>,
}

/// Where an acquisition stands when it does not hold the lock (yet).
pub(super) enum Step {
    Acquired(Won),
    /// `try_acquire` found another holder.
    NotFirst,
}

impl Inner {
    pub(super) async fn turn(self: &Arc<Self>, key: &str) -> Turn {
        let mutex = lock(&self.turns).entry(key.to_owned()).or_default().clone();
        Turn {
            guard: Some(mutex.lock_owned().await),
            key: key.to_owned(),
            inner: self.clone(),
        }
    }

    pub(super) fn try_turn(self: &Arc<Self>, key: &str) -> Option<Turn> {
        let mutex = lock(&self.turns).entry(key.to_owned()).or_default().clone();
        let guard = mutex.try_lock_owned().ok();
        // Built even on failure, so that its Drop prunes the map entry.
        let turn = Turn {
            guard,
            key: key.to_owned(),
            inner: self.clone(),
        };
        turn.guard.is_some().then_some(turn)
    }

    /// Deletes `entry` if it is still the key created at `revision`.
    ///
    /// Without a revision (an enqueue cut off before its answer), the key
    /// that has the name now is that enqueue's, or an older one nobody
    /// counts on, as the caller holds the key's turn (or the name is its
    /// alone, for a permit); it is read and deleted by its revision, so that
    /// a delete arriving late can never remove a key created after it. A key
    /// on a lease that is not one of our sessions is never ours: a
    /// read-write entry is named by a clock, and the enqueue may have found
    /// the name taken by another client.
    pub(super) async fn delete_entry(
        &self,
        entry: &str,
        revision: Option<i64>,
    ) -> Result<bool, LockError> {
        let revision = match revision {
            Some(revision) => revision,
            None => {
                let answer = self
                    .txn(Txn::new().and_then([TxnOp::get(entry, None)]))
                    .await?;
                let found = match answer.op_responses().first() {
                    Some(TxnOpResponse::Get(get)) => get
                        .kvs()
                        .first()
                        .map(|kv| (kv.create_revision(), kv.lease())),
                    _ => None,
                };
                match found {
                    // A live guard's key is never an abandoned entry.
                    Some((revision, lease))
                        if self.live_until(entry, revision).is_none()
                            && self.is_our_lease(lease).await =>
                    {
                        revision
                    }
                    _ => return Ok(false),
                }
            }
        };
        let txn = Txn::new()
            .when([Compare::create_revision(entry, CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(entry, None)]);
        let answer = self.txn(txn).await?;
        Ok(answer.succeeded())
    }

    /// Deletes a queue entry after an acquisition ended without the lock,
    /// retrying a few times: a ghost entry would block the queue for as long
    /// as this process keeps the session alive.
    pub(super) async fn clean_up(&self, entry: &str, revision: Option<i64>, racing_create: bool) {
        for attempt in 0..4u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100) * 2u32.pow(attempt)).await;
            }
            if self.delete_entry(entry, revision).await.is_ok() {
                if racing_create {
                    // The enqueue was cut off in flight: it may still be
                    // applied after our delete. Look once more a moment later.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = self.delete_entry(entry, revision).await;
                }
                return;
            }
        }
        tracing::warn!(entry, "could not delete an abandoned etcd queue entry; it goes when the session lease expires");
    }

    /// `try_acquire` and `acquire` in one: enqueue, and unless `once`, wait
    /// for the predecessors to go. `progress` tells the caller, if its
    /// deadline passes, whether etcd was failing or silent at that moment.
    ///
    /// Errors (a member down, an election) are retried: until the caller's
    /// deadline if it has one (a leader election takes a second or two and
    /// must not cost the waiter its place), else until etcd has not answered
    /// for a ttl: by then our queue entry may have expired, the service is
    /// down, and waiting on would only hide it.
    pub(super) async fn take(
        self: &Arc<Self>,
        line: &impl Line,
        queued: &mut Queued,
        once: bool,
        patient: bool,
        progress: &mut Progress,
    ) -> Result<Step, LockError> {
        let asked = line.asked();
        let mut give_up = after(Instant::now(), asked.ttl);
        let mut backoff = Duration::from_millis(20);
        let mut requeues = 0;
        let mut taken = 0;
        // An enqueue that went unanswered may still land: the next one asks
        // under the same name (and session), so that the late one is found
        // and replaced instead of standing ahead of us (see `rw.rs`; a
        // plain lock's entry name is its session's anyway).
        let mut unanswered: Option<(String, i64)> = None;
        let mut retry = |e: LockError, failure: &mut Option<LockError>, give_up: Instant| {
            if once || (!patient && Instant::now() + backoff >= give_up) {
                return Err(e);
            }
            *failure = Some(e);
            let wait = backoff;
            backoff = (backoff * 2).min(Duration::from_millis(500));
            Ok(wait)
        };
        'enqueue: loop {
            if requeues > MAX_REQUEUES {
                return Err(self.error(format!(
                    "the session lease of `{}` expired {MAX_REQUEUES} times while queueing; etcd is expiring leases faster than the ttl {:?}",
                    asked.key, asked.ttl
                )));
            }
            progress.asking_since = Some(Instant::now());
            let session = match self.session(asked.ttl).await {
                Ok(s) => s,
                Err(e) => {
                    tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                    continue;
                }
            };
            progress.asking_since = Some(Instant::now());
            match self.fresh(&session, asked.ttl).await {
                Ok(Alive::Yes) => {}
                Ok(Alive::Gone) => {
                    requeues += 1;
                    continue;
                }
                Err(e) => {
                    tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                    continue;
                }
            }
            give_up = after(Instant::now(), asked.ttl);
            let entry = match unanswered.take() {
                Some((entry, id)) if id == session.id => entry,
                _ => line.entry(&session),
            };
            queued.entry = Some(entry.clone());
            queued.revision = None;
            queued.in_flight = true;
            progress.asking_since = Some(Instant::now());
            let (mine, first) = match line.enqueue(&session, &entry).await {
                Ok(Enqueued::Created { mine, first }) => (mine, first),
                Ok(Enqueued::Taken) => {
                    // Not ours: nothing to clean up. Bounded, although
                    // two clients picking one nanosecond twice is unheard of.
                    queued.entry = None;
                    queued.in_flight = false;
                    progress.answered();
                    taken += 1;
                    if taken >= NAME_TRIES {
                        return Err(self.error(format!(
                            "{NAME_TRIES} names picked for an entry of `{}` were all taken by other clients",
                            asked.key
                        )));
                    }
                    continue;
                }
                Ok(Enqueued::HeldHere { until }) => {
                    // The name is a live guard's key: never ours to clean up.
                    queued.entry = None;
                    queued.in_flight = false;
                    progress.answered();
                    if once {
                        return Ok(Step::NotFirst);
                    }
                    tokio::time::sleep_until(until.into()).await;
                    continue;
                }
                Err(e) if lease_not_found(&e) => {
                    session.mark_dead();
                    queued.in_flight = false;
                    requeues += 1;
                    continue;
                }
                Err(e) => {
                    unanswered = Some((entry, session.id));
                    tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                    continue;
                }
            };
            queued.in_flight = false;
            queued.revision = Some(mine);
            progress.answered();
            if first {
                return Ok(Step::Acquired(Won {
                    entry,
                    revision: mine,
                    session,
                }));
            }
            if once {
                return Ok(Step::NotFirst);
            }

            // Wait for every older entry to go, watching only the youngest of them.
            loop {
                progress.asking_since = Some(Instant::now());
                match self.fresh(&session, asked.ttl).await {
                    Ok(Alive::Yes) => give_up = after(Instant::now(), asked.ttl),
                    Ok(Alive::Gone) => {
                        session.mark_dead();
                        requeues += 1;
                        continue 'enqueue;
                    }
                    Err(e) => {
                        tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                        continue;
                    }
                }
                progress.asking_since = Some(Instant::now());
                let ahead = match line.ahead(&entry, mine).await {
                    Ok(ahead) => ahead,
                    Err(e) => {
                        tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                        continue;
                    }
                };
                progress.answered();
                give_up = after(Instant::now(), asked.ttl);
                let (predecessor, revision) = match ahead {
                    Ahead::First => {
                        return Ok(Step::Acquired(Won {
                            entry,
                            revision: mine,
                            session,
                        }))
                    }
                    // Our entry is gone: the session expired, or someone
                    // deleted it. Queue again at the end.
                    Ahead::Gone => {
                        requeues += 1;
                        continue 'enqueue;
                    }
                    Ahead::Behind { key, revision } => (key, revision),
                };
                // Refresh the session before our entry's lease could run
                // low while we wait.
                let refresh_at = after(session.refreshed(), asked.ttl / 4);
                progress.asking_since = Some(Instant::now());
                let stream = match self.watch(&predecessor, revision).await {
                    Ok(Some(stream)) => stream,
                    // Gone (or written again) since the read: read again.
                    Ok(None) => continue,
                    Err(e) => {
                        tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                        continue;
                    }
                };
                // Waiting for the holder is not waiting for etcd.
                progress.asking_since = None;
                if let Err(e) = self.await_delete(stream, refresh_at, None).await {
                    tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                }
            }
        }
    }

    /// Reads the youngest entry of `line` older than ours (the largest
    /// revision `by` below `mine`; deeper keys skipped, page by page, see
    /// `contenders.rs`) and, in the same transaction, whether our `entry` is
    /// still the key created at `mine`.
    pub(super) async fn read_ahead(
        &self,
        line: Contenders<'_>,
        by: SortTarget,
        entry: &str,
        mine: i64,
    ) -> Result<Ahead, LockError> {
        let prefix = line.prefix();
        let mut below = mine - 1;
        // Each page starts below the last one's oldest key: bounded by the
        // number of keys under the directory.
        loop {
            let older = Contenders::page(by, SortOrder::Descend, Some(below));
            let txn = Txn::new().and_then([
                TxnOp::get(prefix.as_str(), Some(older)),
                TxnOp::get(entry, None),
            ]);
            let answer = self.txn(txn).await?;
            let ops = answer.op_responses();
            if first_create_revision(ops.get(1)) != Some(mine) {
                return Ok(Ahead::Gone);
            }
            let Some(page) = get_of(ops.first()) else {
                return Ok(Ahead::First);
            };
            if let Some(kv) = line.first_in(page) {
                return Ok(Ahead::Behind {
                    key: kv.key().to_vec(),
                    revision: revision_of(&answer).unwrap_or(0),
                });
            }
            // A page of deeper keys only: read on below it. (Keys one
            // transaction created share a revision; a line entry would not
            // be created in a foreign key's transaction.)
            match page.kvs().last() {
                Some(last) if page.more() && revision(last, by) <= below => {
                    below = revision(last, by) - 1;
                }
                _ => return Ok(Ahead::First),
            }
        }
    }

    /// Stands in `line` until our entry is first (`once`: only if it is
    /// first at once), at most until `deadline`, and records the won lease.
    /// `turn` (the mutex's; see [`Inner::turns`]) is kept until the entry
    /// holds the lock or is gone from the server.
    pub(super) async fn join(
        self: &Arc<Self>,
        line: &impl Line,
        turn: Option<Turn>,
        deadline: Option<Instant>,
        once: bool,
    ) -> Result<Option<Lease>, LockError> {
        let mut queued = Queued {
            inner: self.clone(),
            turn,
            entry: None,
            revision: None,
            in_flight: false,
        };
        let mut progress = Progress::default();
        let taken = {
            let work = self.take(line, &mut queued, once, deadline.is_some(), &mut progress);
            deadline::until(deadline.filter(|_| !once), work).await
        };
        match taken {
            Some(Ok(Step::Acquired(won))) => {
                queued.disarm();
                let lease = line.lease(won.entry, won.revision, &won.session);
                self.hold(&lease, won.session, won.revision);
                Ok(Some(lease))
            }
            Some(Ok(Step::NotFirst)) => {
                queued.finish().await;
                Ok(None)
            }
            Some(Err(e)) => Err(e),
            // The deadline passed: a timeout, unless the service was failing.
            None => progress.at_deadline(self).await,
        }
    }

    /// Watches `predecessor` for its delete after `revision` (the revision
    /// of the read that found it ahead); `None` when it changed since that
    /// read (deleted, or written again), so the caller reads again at once.
    ///
    /// The watch starts at the server's current revision, not at
    /// `revision + 1`: etcd serves a watch that starts in the past from its
    /// catch-up loop, which runs every 100 ms, and under contention other
    /// waiters' writes always put `revision + 1` in the past, so a hand-off
    /// waited up to 100 ms (24 ms per critical section on average with 16
    /// waiters). What happened between the read and the watch's start is
    /// read instead, once the watch is there: a key that is still as it was
    /// then can only go at a revision the watch delivers.
    pub(super) async fn watch(
        &self,
        predecessor: &[u8],
        revision: i64,
    ) -> Result<Option<WatchStream>, LockError> {
        let stream = self
            .rpc(|| {
                let mut watches = self.client.watch_client();
                let key = predecessor.to_vec();
                async move { watches.watch(key, None).await }
            })
            .await?;
        let now = self
            .rpc(|| {
                let mut kv = self.client.kv_client();
                let key = predecessor.to_vec();
                let options = GetOptions::new().with_keys_only();
                async move { kv.get(key, Some(options)).await }
            })
            .await?;
        let unchanged = now
            .kvs()
            .first()
            .is_some_and(|kv| kv.mod_revision() <= revision);
        Ok(unchanged.then_some(stream))
    }

    /// Waits until the watch sees a delete (the predecessor, or a permit
    /// under the semaphore's prefix: an entry of `only`, not a deeper key),
    /// or until `until` (time to refresh the session). Either way the
    /// caller reads again.
    pub(super) async fn await_delete(
        &self,
        mut stream: WatchStream,
        until: Instant,
        only: Option<Contenders<'_>>,
    ) -> Result<(), LockError> {
        loop {
            let message = tokio::select! {
                m = stream.message() => m,
                _ = tokio::time::sleep_until(until.into()) => return Ok(()),
            };
            match message {
                Ok(Some(answer)) => {
                    let deleted = answer.events().iter().any(|e| {
                        e.event_type() == EventType::Delete
                            && only
                                .is_none_or(|line| e.kv().is_some_and(|kv| line.contains(kv.key())))
                    });
                    // Cancelled (compaction, lost leader): read again.
                    if deleted || answer.canceled() {
                        return Ok(());
                    }
                }
                Ok(None) => return Err(self.error("the watch stream was closed by the server")),
                Err(e) => return Err(self.error(e)),
            }
        }
    }
}

/// A queue entry that is not (yet) a held lease. Dropping it deletes the
/// entry in the background, which makes `acquire` cancel safe.
pub(super) struct Queued {
    pub(super) inner: Arc<Inner>,
    pub(super) turn: Option<Turn>,
    pub(super) entry: Option<String>,
    pub(super) revision: Option<i64>,
    /// The enqueue request was sent and not answered.
    pub(super) in_flight: bool,
}

impl Queued {
    /// The acquisition won: nothing to clean up.
    pub(super) fn disarm(&mut self) {
        self.entry = None;
    }

    /// Deletes the entry now (the server just answered, so this is quick).
    pub(super) async fn finish(mut self) {
        if let Some(entry) = self.entry.take() {
            self.inner
                .clean_up(&entry, self.revision, self.in_flight)
                .await;
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        let (inner, revision, racing) = (self.inner.clone(), self.revision, self.in_flight);
        // The turn moves into the cleanup: the next acquisition of this key
        // by this backend starts only after the entry is gone.
        let turn = self.turn.take();
        // On dlock's background runtime, for the reasons `held.rs`'s
        // `Releasing` gives. If it cannot run, the entry stays until the
        // session lease expires, or until the next enqueue of the key deletes
        // it (by its revision, as it does any older key of its name).
        crate::lease::background::spawn(async move {
            inner.clean_up(&entry, revision, racing).await;
            let key = turn.as_ref().map(|t| t.key.clone());
            drop(turn);
            if racing {
                let inner = Arc::downgrade(&inner);
                crate::lease::background::spawn_daemon(look_for_late_enqueue(inner, entry, key));
            }
        });
    }
}

/// When an enqueue that was cut off in flight is looked for again, after
/// the first cleanup: a request held in the network (a NAT or a proxy that
/// delivers late, a paused member) can still land seconds later, and its
/// entry, on our live session, would stand in line ahead of every other
/// client until the session ends.
const LATE_LOOKS: [Duration; 6] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
    Duration::from_secs(32),
];

/// Deletes `entry` if a cut-off enqueue of it lands late (see
/// [`LATE_LOOKS`]); ends early once the backend is gone (its sessions with
/// it). `key` is the lock key whose turn a plain lock's or an election's
/// entry needs: while another acquisition of the key runs here the look is
/// skipped (the entry name is the session's, and that acquisition deletes
/// an older key of its name itself); a read-write entry's name is its own.
async fn look_for_late_enqueue(inner: std::sync::Weak<Inner>, entry: String, key: Option<String>) {
    let mut slept = Duration::ZERO;
    for at in LATE_LOOKS {
        tokio::time::sleep(at - slept).await;
        slept = at;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let turn = match &key {
            Some(key) => match inner.try_turn(key) {
                Some(turn) => Some(turn),
                None => continue,
            },
            None => None,
        };
        // A plain lock's entry name is its session's: a guard taken since
        // may hold a key of this name. `delete_entry` spares a guard whose
        // lease is valid; one whose renewal is late (valid until a moment
        // ago, still on the server) must be spared too, or its release would
        // find its key gone. (A CI rehearsal's segment release did.)
        if inner.holds_name(&entry) {
            continue;
        }
        if let Ok(true) = inner.delete_entry(&entry, None).await {
            tracing::debug!(
                entry,
                "deleted an etcd queue entry whose enqueue landed late"
            );
        }
        drop(turn);
    }
}
