//! Double barriers on etcd, after the double barrier of etcd's `recipes`:
//! members are keys on the backend's session lease, a `ready` key opens
//! the barrier, and waiters are woken by a watch on the barrier's prefix.
//!
//! - A member is `<prefix>-barriers/<escaped name>/members/<lease-hex>-<token>`
//!   on the session lease: a member whose process dies is counted out when
//!   the lease expires (the ttl). The `-barriers` root keeps barrier keys
//!   apart from every other kind of name.
//! - `enter` creates its key, then, behind a watch on the barrier's prefix,
//!   reads the member count and `ready` in one transaction: with `ready`
//!   and another member in, the barrier is open; with `parties` members, it
//!   puts `ready` (no lease) and passes; else it waits for the watch (any
//!   arrival, departure or `ready`), refreshing its session meanwhile, and
//!   reads again. A `ready` with no other member in is left over from a
//!   round whose members all died: deleted (if unchanged), and the barrier
//!   is closed.
//! - `leave` deletes its key, then waits (a watch on `members/`) until no
//!   member is left and deletes `ready`, closing the barrier.
//! - A timed-out, failed or dropped `enter` deletes its key (`Queued`), as
//!   lock acquisitions do.
//! - Renewal and removal are those of lock keys: a keep-alive of the session
//!   plus a read of the key, and a compare-and-delete.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, WatchOptions, WatchStream,
};

use super::client::{first_create_revision, revision_of};
use super::contenders::get_of;
use super::queue::{Queued, MAX_REQUEUES};
use super::session::{after, Alive};
use super::{names, EtcdBackend, Inner};
use crate::backend::{deadline, BarrierBackend, BarrierRequest, Lease, Renewal};
use crate::LockError;

/// What one read of a barrier shows.
struct Seen {
    /// Members in (our own key included).
    members: i64,
    /// `ready`'s mod revision, if it is there.
    ready: Option<i64>,
    /// Whether our own key is still there.
    ours: bool,
}

impl Inner {
    /// `<prefix>-barriers/<escaped name>/`.
    fn barrier_dir(&self, name: &str) -> String {
        format!("{}-barriers/{}/", self.prefix, names::escape(name))
    }

    /// A watch on every key under `prefix`, from now.
    async fn watch_prefix(&self, prefix: &str) -> Result<WatchStream, LockError> {
        let options = WatchOptions::new().with_prefix();
        self.rpc(|| {
            let mut watches = self.client.watch_client();
            let (prefix, options) = (prefix.to_owned(), options.clone());
            async move { watches.watch(prefix, Some(options)).await }
        })
        .await
    }

    /// Waits for any event on `stream`, or until `until`.
    async fn await_event(
        &self,
        stream: &mut WatchStream,
        until: Option<Instant>,
    ) -> Result<(), LockError> {
        let sleep = async {
            match until {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        loop {
            let message = tokio::select! {
                m = stream.message() => m,
                () = &mut sleep => return Ok(()),
            };
            match message {
                Ok(Some(answer)) if !answer.events().is_empty() || answer.canceled() => {
                    return Ok(())
                }
                // The watch's creation: wait on.
                Ok(Some(_)) => {}
                Ok(None) => return Err(self.error("the watch stream was closed by the server")),
                Err(e) => return Err(self.error(e)),
            }
        }
    }

    /// The member count, `ready` and our own key, in one read.
    async fn barrier_seen(&self, dir: &str, entry: &str) -> Result<Seen, LockError> {
        let members = format!("{dir}members/");
        let ready = format!("{dir}ready");
        let txn = Txn::new().and_then([
            TxnOp::get(
                members.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
            TxnOp::get(ready.as_str(), None),
            TxnOp::get(entry, Some(GetOptions::new().with_count_only())),
        ]);
        let answer = self.txn(txn).await?;
        let ops = answer.op_responses();
        Ok(Seen {
            members: get_of(ops.first()).map_or(0, |g| g.count()),
            ready: get_of(ops.get(1))
                .and_then(|g| g.kvs().first())
                .map(|kv| kv.mod_revision()),
            ours: get_of(ops.get(2)).is_some_and(|g| g.count() > 0),
        })
    }

    async fn enter_member(self: &Arc<Self>, req: &BarrierRequest) -> Result<Lease, LockError> {
        let dir = self.barrier_dir(&req.name);
        let ready = format!("{dir}ready");
        for _ in 0..=MAX_REQUEUES {
            let session = self.session(req.ttl).await?;
            if let Alive::Gone = self.fresh(&session, req.ttl).await? {
                session.mark_dead();
                continue;
            }
            let entry = format!("{dir}members/{:x}-{}", session.id, req.token);
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
                .and_then([TxnOp::put(
                    entry.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(session.id)),
                )])
                // Our own create, applied once already (an answer lost).
                .or_else([TxnOp::get(entry.as_str(), None)]);
            let answer = self.txn(txn).await?;
            queued.in_flight = false;
            let mine = if answer.succeeded() {
                revision_of(&answer)
            } else {
                first_create_revision(answer.op_responses().first())
            };
            let Some(mine) = mine else {
                return Err(self.error(format!(
                    "etcd did not create the barrier member `{entry}` (it was not there either)"
                )));
            };
            queued.revision = Some(mine);
            loop {
                // The watch first: a change after the read wakes it.
                let mut stream = self.watch_prefix(&dir).await?;
                let seen = self.barrier_seen(&dir, &entry).await?;
                if !seen.ours {
                    // Our key is gone (session expired, or deleted by
                    // someone): enter again.
                    break;
                }
                let open = match seen.ready {
                    Some(_) if seen.members > 1 => true,
                    Some(stale) => {
                        // Left over by a round whose members all went.
                        let txn = Txn::new()
                            .when([Compare::mod_revision(
                                ready.as_str(),
                                CompareOp::Equal,
                                stale,
                            )])
                            .and_then([TxnOp::delete(ready.as_str(), None)]);
                        self.txn(txn).await?;
                        continue;
                    }
                    None if seen.members >= req.parties as i64 => {
                        self.rpc(|| {
                            let mut kv = self.client.kv_client();
                            let ready = ready.clone();
                            async move { kv.put(ready, "", None).await }
                        })
                        .await?;
                        true
                    }
                    None => false,
                };
                if open {
                    queued.disarm();
                    let lease = Lease {
                        key: req.name.clone(),
                        token: req.token.clone(),
                        ttl: req.ttl,
                        // Renew and removal check the key by it.
                        fencing_token: Some(mine as u64),
                        valid_until: session.deadline(req.ttl),
                        resource: entry,
                    };
                    self.hold(&lease, session, mine);
                    return Ok(lease);
                }
                // Refresh the session before our key's lease could run low.
                let refresh_at = after(session.refreshed(), req.ttl / 4);
                self.await_event(&mut stream, Some(refresh_at)).await?;
                if let Alive::Gone = self.fresh(&session, req.ttl).await? {
                    session.mark_dead();
                    break;
                }
            }
        }
        Err(self.error(format!(
            "the session lease expired {MAX_REQUEUES} times while entering the barrier `{}`",
            req.name
        )))
    }

    /// Waits until no member is left in the barrier of `member`, then
    /// deletes `ready`.
    async fn members_gone(&self, member: &Lease) -> Result<(), LockError> {
        let Some((members, _)) = member.resource.rsplit_once('/') else {
            return Err(self.error(format!("`{}` is not a barrier member key", member.resource)));
        };
        let members = format!("{members}/");
        let dir = members.strip_suffix("members/").unwrap_or(&members);
        let ready = format!("{dir}ready");
        loop {
            let mut stream = self.watch_prefix(&members).await?;
            let count = self
                .rpc(|| {
                    let mut kv = self.client.kv_client();
                    let members = members.clone();
                    async move {
                        kv.get(
                            members,
                            Some(GetOptions::new().with_prefix().with_count_only()),
                        )
                        .await
                    }
                })
                .await?
                .count();
            if count == 0 {
                self.rpc(|| {
                    let mut kv = self.client.kv_client();
                    let ready = ready.clone();
                    async move { kv.delete(ready, None).await }
                })
                .await?;
                return Ok(());
            }
            self.await_event(&mut stream, None).await?;
        }
    }
}

#[async_trait]
impl BarrierBackend for EtcdBackend {
    async fn enter_barrier(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        // Dropping the wait at the deadline deletes our key (`Queued`).
        deadline::until(deadline, async {
            self.inner.enter_member(req).await.map(Some)
        })
        .await
        .unwrap_or(Ok(None))
    }

    async fn wait_all_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        deadline::until(deadline, async {
            self.inner.members_gone(member).await.map(|()| true)
        })
        .await
        .unwrap_or(Ok(false))
    }

    /// Member keys are session keys like lock keys: the same keep-alive and read.
    async fn renew_members(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_any(leases).await
    }

    async fn remove_member(&self, lease: &Lease) -> Result<bool, LockError> {
        self.inner.release_entry(lease, None).await
    }
}
