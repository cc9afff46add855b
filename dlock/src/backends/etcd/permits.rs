//! Semaphores on etcd: the first N keys by create revision directly under
//! the semaphore's prefix hold its permits (a deeper key is another
//! resource's, see `contenders.rs`).
//!
//! - A permit (held or awaited) is the key
//!   `<prefix>-semaphores/<escaped name>/<lease-hex>-<escaped token>` on the
//!   backend's session lease for the ttl. The `-semaphores` root keeps
//!   semaphore keys out of every lock's queue directory (`<prefix>/<key>/`).
//!   The name is escaped as lock keys are (`%` → `%25`, `/` → `%2F`, see
//!   `names.rs`), so `exports` and `exports/big` are separate semaphores.
//!   The token in the name lets one backend hold several permits of one
//!   semaphore.
//! - One transaction creates the key and reads the first keys of the
//!   directory by create revision: the entries hold permits in arrival
//!   order while their counts fit (`<permits>` as the value for one permit,
//!   `<permits>:<n>` for n at once); the first that does not fit stops
//!   everyone behind it. If ours is among the holders, we hold.
//! - The permit count: each key's value is the count its acquirer gave.
//!   Right after creating its key, an acquirer reads the keys created
//!   before it (the transaction's first page, with values, and as many
//!   pages after it as it takes); if one of them has another count, it
//!   deletes its own key and answers [`permit_count_differs`]. So no two
//!   live keys with different counts both pass: whichever of them was
//!   created later read the other. The count goes with the last key; a
//!   caller may be refused for the count of a key that is itself about to
//!   be refused (two counts racing in), never let in beside one.
//!   Entries are ordered by arrival, so waiters are served first come, first
//!   served (a waiter's key holds its place).
//! - A waiter watches the directory for deletes from the revision after its
//!   read, then reads again; it refreshes its session lease while it waits.
//!   Every release wakes every waiter of the semaphore once (N holders can
//!   free any of N places, so there is no single predecessor to watch).
//! - A timed-out, failed or dropped acquisition deletes its key (in the
//!   background if dropped), as lock acquisitions do.
//! - Renewal and release are those of lock keys: a keep-alive of the session
//!   plus a read of the key (by its create revision, kept in
//!   `Lease::fencing_token`), and a compare-and-delete.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};

use super::client::{first_create_revision, revision_of};
use super::contenders::{get_of, Contenders};
use super::names::Kind;
use super::queue::{Queued, MAX_REQUEUES};
use super::refused::About;
use super::session::{after, Alive};
use super::{EtcdBackend, Inner};
use async_trait::async_trait;

use crate::backend::holder::holder_of;
use crate::backend::{
    permit_count_differs, Lease, PermitBackend, PermitHolder, PermitRequest, Renewal, SemaphoreInfo,
};
use crate::{backend::deadline, LockError};

/// An entry's value: the permit count its acquirer gave, and how many of
/// them it takes (`<permits>` for one, `<permits>:<count>` for several, so
/// a one-permit entry reads as an earlier dlock wrote it). `None` for a
/// value without a count (an earlier dlock's, or another client's).
fn entry_value(value: &[u8]) -> Option<(usize, usize)> {
    let text = std::str::from_utf8(value).ok()?;
    match text.split_once(':') {
        Some((permits, count)) => Some((permits.parse().ok()?, count.parse().ok()?)),
        None => Some((text.parse().ok()?, 1)),
    }
}

/// What an acquirer writes as its key's value (see [`entry_value`]).
fn entry_text(permits: usize, count: usize) -> String {
    if count == 1 {
        permits.to_string()
    } else {
        format!("{permits}:{count}")
    }
}

/// The create revision of our own key, as a get in a transaction returned it.
fn own_revision(op: Option<&TxnOpResponse>) -> Option<i64> {
    get_of(op).and_then(|get| get.kvs().first().map(|kv| kv.create_revision()))
}

impl Inner {
    /// `<prefix>-semaphores/<escaped name>/`: the directory of a semaphore's keys.
    fn semaphore_dir(&self, name: &str) -> String {
        format!("{}/", self.prefix_of(Kind::Semaphore, name))
    }

    /// The first keys of `dir` by create revision, with their values (each
    /// holds its acquirer's permit count), from revision `from` on.
    fn first_with_values(from: Option<i64>) -> GetOptions {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(super::contenders::PAGE);
        match from {
            Some(min) => options.with_min_create_revision(min),
            None => options,
        }
    }

    /// The permit count of an entry of `dir` created before `mine` that
    /// is not `permits`, if there is one, read from `page` (the first page
    /// with values, read in a transaction) and as many pages after it as
    /// it takes. An entry without a count (written by an earlier dlock)
    /// agrees with any.
    async fn other_count(
        &self,
        dir: &str,
        (mine, permits): (i64, usize),
        page: Option<&GetResponse>,
    ) -> Result<Option<usize>, LockError> {
        let line = Contenders {
            dir,
            kinds: Contenders::DIRECT,
        };
        let mut next = page.cloned();
        while let Some(page) = next.take() {
            for kv in page.kvs() {
                if kv.create_revision() >= mine {
                    return Ok(None);
                }
                let count = entry_value(kv.value()).map(|(permits, _)| permits);
                match count {
                    Some(count) if count != permits && line.contains(kv.key()) => {
                        return Ok(Some(count))
                    }
                    _ => {}
                }
            }
            let Some(last) = page.kvs().last().filter(|_| page.more()) else {
                break;
            };
            let options = Self::first_with_values(Some(last.create_revision() + 1))
                .with_max_create_revision(mine - 1);
            next = Some(self.read_page(dir, options).await?);
        }
        Ok(None)
    }

    /// One page of `dir`'s keys as `options` ask (a range read, retried as
    /// every request of this backend).
    async fn read_page(&self, dir: &str, options: GetOptions) -> Result<GetResponse, LockError> {
        self.rpc(|| {
            let mut kv = self.client.kv_client();
            let (dir, options) = (dir.to_owned(), options.clone());
            async move { kv.get(dir, Some(options)).await }
        })
        .await
    }

    /// The entries of `dir` that hold permits, with their counts and keys, in
    /// arrival order (its direct children: a deeper key is another
    /// resource's and holds no permit, see `contenders.rs`): the longest
    /// first run of entries whose counts sum to at most `permits`. An entry
    /// that does not fit stops the run, so nobody behind it passes it (a
    /// waiting taker of 4 is not overtaken by later takers of 1). Read from
    /// `page` (the first page with values, read in a transaction) and as
    /// many pages after it as it takes.
    async fn holders(
        &self,
        dir: &str,
        permits: usize,
        page: Option<&GetResponse>,
    ) -> Result<Vec<(i64, usize, Vec<u8>)>, LockError> {
        let line = Contenders {
            dir,
            kinds: Contenders::DIRECT,
        };
        let mut holders = Vec::new();
        let mut held = 0usize;
        let mut next = page.cloned();
        // Each page starts past the last one's youngest key: bounded by
        // the number of keys under the directory, and by `permits` entries
        // (each takes at least 1).
        while let Some(page) = next.take() {
            for kv in page.kvs().iter().filter(|kv| line.contains(kv.key())) {
                let count = entry_value(kv.value()).map_or(1, |(_, count)| count.max(1));
                if held.saturating_add(count) > permits {
                    return Ok(holders);
                }
                held += count;
                holders.push((kv.create_revision(), count, kv.key().to_vec()));
            }
            if held >= permits || !page.more() {
                break;
            }
            let Some(last) = page.kvs().last() else {
                break;
            };
            let options = Self::first_with_values(Some(last.create_revision() + 1));
            next = Some(self.read_page(dir, options).await?);
        }
        Ok(holders)
    }

    /// The first page of `dir`'s entries with values, and the permit count
    /// its first entry gave (`None` without one, or for an entry of an
    /// earlier dlock, which wrote no count).
    async fn first_page(&self, dir: &str) -> Result<(GetResponse, Option<usize>), LockError> {
        let page = self.read_page(dir, Self::first_with_values(None)).await?;
        let line = Contenders {
            dir,
            kinds: Contenders::DIRECT,
        };
        let first = page.kvs().iter().find(|kv| line.contains(kv.key()));
        let stored = first.and_then(|kv| entry_value(kv.value())).map(|(p, _)| p);
        Ok((page, stored))
    }

    /// How many of `permits` are free in the semaphore `name`: `permits`
    /// minus the counts of its holders (see [`holders`](Self::holders)).
    pub(super) async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        let dir = self.semaphore_dir(name);
        let (page, stored) = self.first_page(&dir).await?;
        if let Some(stored) = stored.filter(|stored| *stored != permits) {
            return Err(permit_count_differs(name, stored, permits));
        }
        let holders = self.holders(&dir, permits, Some(&page)).await?;
        let held: usize = holders.iter().map(|(_, count, _)| count).sum();
        Ok(permits.saturating_sub(held))
    }

    /// The holders of the semaphore `name` (their client names from the
    /// tokens in their keys, `<lease-hex>-<token>`) and the count the
    /// first entry gave; nothing stored without an entry (or with only an
    /// entry of an earlier dlock, which wrote no count).
    pub(super) async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let dir = self.semaphore_dir(name);
        let (page, stored) = self.first_page(&dir).await?;
        let Some(stored) = stored else {
            return Ok(SemaphoreInfo::new(None, Vec::new()));
        };
        let holders = self.holders(&dir, stored, Some(&page)).await?;
        let holders = holders
            .into_iter()
            .map(|(_, count, key)| {
                let entry = String::from_utf8_lossy(&key[dir.len().min(key.len())..]).into_owned();
                let token = entry.split_once('-').map_or("", |(_, token)| token);
                let token = super::names::unescape(token);
                PermitHolder::new(holder_of(&token).map(str::to_owned), None, count)
            })
            .collect();
        Ok(SemaphoreInfo::new(Some(stored), holders))
    }

    /// The names of the semaphores starting with `prefix` that have an
    /// entry (held or awaited): keys-only pages of their root, a page per
    /// semaphore at most (`names_under`).
    pub(super) async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let root = self.root(Kind::Semaphore);
        self.names_under(&root, prefix, "semaphores").await
    }

    /// Takes a permit: enqueue, and unless `once`, wait until our key is
    /// among the first `req.permits`. The caller bounds this by its deadline;
    /// dropping it deletes our key in the background. `watching` is true
    /// while it waits for a release (no request in flight).
    pub(super) async fn permit(
        self: &Arc<Self>,
        req: &PermitRequest,
        once: bool,
        watching: &AtomicBool,
    ) -> Result<Option<Lease>, LockError> {
        let dir = self.semaphore_dir(&req.name);
        for _ in 0..=MAX_REQUEUES {
            let session = self.session(req.ttl).await?;
            if let Alive::Gone = self.fresh(&session, req.ttl).await? {
                session.mark_dead();
                continue;
            }
            // A client name may hold `/`: escaped, the token stays one segment.
            let entry = format!("{dir}{:x}-{}", session.id, super::names::escape(&req.token));
            let mut queued = Queued {
                inner: self.clone(),
                turn: None,
                entry: Some(entry.clone()),
                revision: None,
                in_flight: true,
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    entry.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([
                    TxnOp::put(
                        entry.as_str(),
                        entry_text(req.permits, req.count),
                        Some(PutOptions::new().with_lease(session.id)),
                    ),
                    TxnOp::get(dir.as_str(), Some(Self::first_with_values(None))),
                ])
                // The key exists: our own create, applied once already. A
                // connection that broke under it (its answer lost) makes
                // `client.rs` ask again, and the name holds our token.
                .or_else([
                    TxnOp::get(entry.as_str(), None),
                    TxnOp::get(dir.as_str(), Some(Self::first_with_values(None))),
                ]);
            let answer = self.txn(txn).await?;
            queued.in_flight = false;
            let mine = if answer.succeeded() {
                revision_of(&answer)
            } else {
                first_create_revision(answer.op_responses().first())
            };
            let Some(mine) = mine else {
                return Err(self.error(format!(
                    "etcd did not create the permit key `{entry}` (it was not there either)"
                )));
            };
            queued.revision = Some(mine);
            let ops = answer.op_responses();
            let first = get_of(ops.get(1));
            if let Some(stored) = self.other_count(&dir, (mine, req.permits), first).await? {
                queued.finish().await;
                return Err(permit_count_differs(&req.name, stored, req.permits));
            }
            let mut holders = self
                .holders(&dir, req.permits, get_of(answer.op_responses().get(1)))
                .await?;
            let mut read_at = mine;
            loop {
                if holders.iter().any(|(revision, _, _)| *revision == mine) {
                    queued.disarm();
                    let lease = Lease {
                        key: req.name.clone(),
                        token: req.token.clone(),
                        ttl: req.ttl,
                        // Not shown to users (a `Permit` has no fencing
                        // token): renew and release check the key by it.
                        fencing_token: Some(mine as u64),
                        valid_until: session.deadline(req.ttl),
                        resource: entry,
                    };
                    self.hold(&lease, session, mine);
                    return Ok(Some(lease));
                }
                if once {
                    queued.finish().await;
                    return Ok(None);
                }
                // Refresh the session before our key's lease could run low.
                let refresh_at = after(session.refreshed(), req.ttl / 4);
                // Nothing asked while it waits for a release (what the
                // caller reads if its deadline comes now).
                watching.store(true, Ordering::Relaxed);
                self.await_delete_under(&dir, read_at, refresh_at).await?;
                watching.store(false, Ordering::Relaxed);
                if let Alive::Gone = self.fresh(&session, req.ttl).await? {
                    session.mark_dead();
                    break;
                }
                let txn = Txn::new().and_then([
                    TxnOp::get(dir.as_str(), Some(Self::first_with_values(None))),
                    TxnOp::get(entry.as_str(), None),
                ]);
                let answer = self.txn(txn).await?;
                let ops = answer.op_responses();
                if own_revision(ops.get(1)) != Some(mine) {
                    // Our key is gone (session expired, or deleted by
                    // someone): queue again at the end.
                    break;
                }
                holders = self.holders(&dir, req.permits, get_of(ops.first())).await?;
                read_at = revision_of(&answer).unwrap_or(read_at);
            }
        }
        Err(self.error(format!(
            "the session lease expired {MAX_REQUEUES} times while waiting for a permit of `{}`",
            req.name
        )))
    }

    /// Whether a key under `dir` that existed at `revision` is gone now:
    /// fewer keys created by then are there now than were then. A history
    /// read that fails (the revision compacted already) counts as a
    /// change: the caller reads again, and reports a real outage then.
    async fn deleted_since(&self, dir: &str, revision: i64) -> Result<bool, LockError> {
        let count = |options: GetOptions| {
            self.rpc(move || {
                let mut kv = self.client.kv_client();
                let (dir, options) = (dir.to_owned(), options.clone());
                async move { kv.get(dir, Some(options)).await }
            })
        };
        let all = GetOptions::new().with_prefix().with_count_only();
        let then = match count(all.clone().with_revision(revision)).await {
            Ok(then) => then.count(),
            Err(_) => return Ok(true),
        };
        let now = count(all.with_max_create_revision(revision)).await?.count();
        Ok(now < then)
    }

    /// Waits until a key under `dir` is deleted after `revision`, or until
    /// `until`. Either way the caller reads again.
    async fn await_delete_under(
        &self,
        dir: &str,
        revision: i64,
        until: Instant,
    ) -> Result<(), LockError> {
        // From the server's current revision, served at once (a watch that
        // starts in the past waits for etcd's 100 ms catch-up loop: see
        // `queue.rs`'s `watch`); a delete between the read and the watch's
        // start is read instead, once the watch is there.
        let options = WatchOptions::new().with_prefix();
        let stream = self
            .rpc(|| {
                let mut watches = self.client.watch_client();
                let (dir, options) = (dir.to_owned(), options.clone());
                async move { watches.watch(dir, Some(options)).await }
            })
            .await?;
        if self.deleted_since(dir, revision).await? {
            return Ok(());
        }
        let line = Contenders {
            dir,
            kinds: Contenders::DIRECT,
        };
        self.await_delete(stream, until, Some(line)).await
    }
}

#[async_trait]
impl PermitBackend for EtcdBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let answer = self.inner.permit(req, true, &AtomicBool::new(false)).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Semaphore(&req.name)))
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        // Dropping the wait at the deadline deletes our key (`Queued`).
        let watching = AtomicBool::new(false);
        let answer = match deadline::until(deadline, self.inner.permit(req, false, &watching)).await
        {
            Some(answer) => answer,
            // Waiting for a release: the permits are taken.
            None if watching.load(Ordering::Relaxed) => Ok(None),
            // A request was in flight: a timeout only if etcd is there.
            None if self.inner.answers_a_read().await => Ok(None),
            None => Err(self.inner.silent_at_deadline(None)),
        };
        answer.map_err(|e| self.inner.name_refusal(e, About::Semaphore(&req.name)))
    }

    /// Permit keys are session keys like lock keys: the same keep-alive and read.
    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let renewed = self.renew_any(leases).await;
        self.inner.name_refusals(leases, renewed, About::Semaphore)
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        let answer = self.inner.release_entry(lease, None).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Semaphore(&lease.key)))
    }

    fn many_permits(&self) -> bool {
        true
    }

    async fn available(&self, name: &str, permits: usize) -> Result<usize, LockError> {
        crate::backend::key::validate(name)?;
        let answer = self.inner.available(name, permits).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Semaphore(name)))
    }

    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        crate::backend::key::validate(name)?;
        let answer = self.inner.inspect_semaphore(name).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Semaphore(name)))
    }

    async fn semaphore_names(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.inner.semaphore_names(prefix).await
    }
}
