//! Double barriers on PostgreSQL: a member is a row of
//! `<schema>.dlock_barriers` (`name`, `member`, `expires`), made on the
//! first use of a barrier as the latches' table is, with an expiry on the
//! server's clock that the watchdog moves on (`barrier_sql.rs`).
//!
//! - **Counted out.** Only rows whose `expires` is ahead of the server's
//!   clock count; every statement that reads a barrier deletes the others.
//!   A member's lease is capped at `?session_timeout=` as every lease of
//!   this backend is, so a member whose process died (or whose guard was
//!   leaked unrenewed) is counted out within its ttl, at most the session
//!   timeout. The members' sessions are not what counts: a member is not
//!   bound to one pooled session (the pool retires and replaces them), so
//!   an ended session alone does not count a live process's member out.
//! - **Open.** The row with the empty member name is `ready` (no expiry):
//!   put by the member that finds `parties` members in, deleted by the
//!   member whose `leave` finds nobody left. A member that arrives while
//!   `ready` is there and another member is in passes at once; a `ready`
//!   with no other live member is left over from a round whose members all
//!   died, and is deleted (the barrier is closed again).
//! - **Woken by `NOTIFY`.** Every arrival, departure, opening and closing
//!   announces the barrier on its own channel
//!   (`dlock_barrier_<16 hex digits>`, sent at commit); waiters share one
//!   `LISTEN` per barrier on the backend's one listening connection (as the
//!   latches do, `channel_listens.rs`), listened before each read. A member that
//!   expires announces nothing: a waiter also wakes at the earliest expiry
//!   of the others (a deadline the read returned, not polling), and an
//!   entering member refreshes its own row every third of its ttl.
//! - **Cancel safe.** A timed-out, failed or dropped `enter` deletes its
//!   row (in the background when dropped); `leave` changes nothing but the
//!   closing, which is idempotent.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::channel_listens::{Listened, LISTENER_CHECK};
use super::session::Session;
use super::{keys, PostgresBackend};
use crate::backend::{lease_deadline, BarrierBackend, BarrierRequest, Lease, Renewal};
use crate::LockError;

/// The `NOTIFY` channel of the barrier `name` under `prefix`.
fn channel_of(prefix: &str, name: &str) -> String {
    format!("dlock_barrier_{:016x}", wake_key(prefix, name) as u64)
}

/// The number the barrier's waiters are registered under (and the payload
/// of its `NOTIFY`s): a digest apart from the advisory keys' and the
/// latches' (a tab cannot be in a prefix).
fn wake_key(prefix: &str, name: &str) -> i64 {
    let digest = keys::digest(&format!("barrier\t{prefix}"), name);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// A duration in µs from the server, as a local duration (never negative).
fn micros(us: Option<i64>) -> Option<Duration> {
    us.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)))
}

/// A ttl in µs for the server.
fn ttl_micros(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

/// What the server says of one barrier.
struct Seen {
    /// Live members other than the caller (all of them, for `left`).
    others: i64,
    ready: bool,
    /// How long until the earliest of those members expires.
    next_expiry: Option<Duration>,
}

/// Removes a member whose `enter` ended without handing it over (timed
/// out, failed, cancelled), in the background, so it never counts.
struct Entering {
    session: Option<Arc<Session>>,
    remove: String,
    params: [String; 4],
}

impl Drop for Entering {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let (remove, params) = (std::mem::take(&mut self.remove), self.params.clone());
        crate::lease::background::spawn(async move {
            let [row, token, channel, payload] = &params;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [row, token, channel, payload];
            let bound = session.client.query_one(&remove, &params);
            let _ = tokio::time::timeout(Duration::from_secs(10), bound).await;
        });
    }
}

/// Waits for a `NOTIFY` of the barrier, `wake` or `deadline` (whichever is
/// first), and notices a listening connection that ended (a local check).
async fn wait_news(
    notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    listened: &Listened,
    wake: Option<Instant>,
) {
    let mut notified = notified;
    let until = async {
        match wake {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            None => std::future::pending().await,
        }
    };
    let mut until = std::pin::pin!(until);
    loop {
        tokio::select! {
            () = notified.as_mut() => return,
            () = &mut until => return,
            () = tokio::time::sleep(LISTENER_CHECK) => {
                if !listened.listening() {
                    // News may have been missed: listen anew, read again.
                    return;
                }
            }
        }
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl PostgresBackend {
    /// Creates the barriers' table on the first use of a barrier.
    async fn ensure_barriers(&self) -> Result<(), LockError> {
        if self.barriers_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let s = &self.statements.barriers;
        self.ensure_table_of(&s.table, &s.create, "barriers")
            .await?;
        self.barriers_ready.store(true, Ordering::Release);
        Ok(())
    }

    /// The barrier's row name, key and channel.
    fn barrier_names(&self, name: &str) -> (String, i64, String) {
        let prefix = &self.config.prefix;
        (
            self.name_of(name),
            wake_key(prefix, name),
            channel_of(prefix, name),
        )
    }

    async fn barrier_arrive(
        &self,
        session: &Session,
        params: &[String; 4],
        ttl: Duration,
    ) -> Result<Seen, LockError> {
        let [row, token, channel, payload] = params;
        let arrive = self.statements.barriers.arrive.as_str();
        let r = self
            .bounded(
                session
                    .client
                    .query_one(arrive, &[row, token, &ttl_micros(ttl), channel, payload]),
            )
            .await?;
        Ok(Seen {
            others: r.get(0),
            ready: r.get(1),
            next_expiry: micros(r.get(2)),
        })
    }

    async fn barrier_enter(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let parties = i64::try_from(req.parties).map_err(|_| {
            LockError::invalid_option(format!(
                "barrier `{}`: too many parties ({})",
                req.name, req.parties
            ))
        })?;
        self.ensure_barriers().await?;
        let (row, key, channel) = self.barrier_names(&req.name);
        let ttl = self.clamp(req.ttl);
        let session = self.any_session().await?;
        let params = [row, req.token.clone(), channel, key.to_string()];
        let mut entering = Entering {
            session: Some(session.clone()),
            remove: self.statements.barriers.remove.clone(),
            params: params.clone(),
        };
        let [row, _, channel, payload] = &params;
        let waiting = self.waiters.register(key);
        loop {
            let listened = self.listen_on(key, channel).await?;
            let notified = waiting.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let sent = Instant::now();
            let seen = self.barrier_arrive(&session, &params, ttl).await?;
            if (seen.ready && seen.others > 0) || seen.others + 1 >= parties {
                if !seen.ready {
                    let open = self.statements.barriers.open.as_str();
                    self.bounded(session.client.query_one(open, &[row, channel, payload]))
                        .await?;
                }
                entering.session = None;
                let valid_until = lease_deadline(sent, ttl);
                let resource = format!("{}({row}, member)", self.statements.barriers.table);
                return Ok(Some(Lease::unfenced(
                    &req.name,
                    &req.token,
                    ttl,
                    valid_until,
                    resource,
                )));
            }
            if seen.ready {
                let close = self.statements.barriers.close_stale.as_str();
                self.bounded(
                    session
                        .client
                        .query_one(close, &[row, &req.token, channel, payload]),
                )
                .await?;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                // Removed before the answer, so that the caller's next step
                // never finds it (should this be cut, `entering` still does).
                let remove = self.statements.barriers.remove.as_str();
                self.bounded(
                    session
                        .client
                        .query_one(remove, &[row, &req.token, channel, payload]),
                )
                .await?;
                entering.session = None;
                return Ok(None);
            }
            // Our own row is refreshed by the next read, before it expires.
            let refresh = sent + ttl / 3;
            let others = seen.next_expiry.map(|d| sent + d);
            let wake = earliest(earliest(Some(refresh), others), deadline);
            wait_news(notified, &listened, wake).await;
        }
    }

    async fn barrier_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        self.ensure_barriers().await?;
        let (row, key, channel) = self.barrier_names(&member.key);
        let payload = key.to_string();
        let waiting = self.waiters.register(key);
        loop {
            let listened = self.listen_on(key, &channel).await?;
            let notified = waiting.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let session = self.any_session().await?;
            let sent = Instant::now();
            let left = self.statements.barriers.left.as_str();
            let r = self
                .bounded(session.client.query_one(left, &[&row, &channel, &payload]))
                .await?;
            drop(session);
            let seen = Seen {
                others: r.get(0),
                ready: false,
                next_expiry: micros(r.get(1)),
            };
            if seen.others == 0 {
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            let others = seen.next_expiry.map(|d| sent + d);
            wait_news(notified, &listened, earliest(others, deadline)).await;
        }
    }
}

#[async_trait]
impl BarrierBackend for PostgresBackend {
    async fn enter_barrier(
        &self,
        req: &BarrierRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.barrier_enter(req, deadline).await
    }

    async fn wait_all_left(
        &self,
        member: &Lease,
        deadline: Option<Instant>,
    ) -> Result<bool, LockError> {
        self.barrier_left(member, deadline).await
    }

    async fn renew_members(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let mut answers = Vec::with_capacity(leases.len());
        for lease in leases {
            answers.push(self.renew_member(lease).await);
        }
        answers
    }

    async fn remove_member(&self, lease: &Lease) -> Result<bool, LockError> {
        self.ensure_barriers().await?;
        let (row, key, channel) = self.barrier_names(&lease.key);
        let session = self.any_session().await?;
        let remove = self.statements.barriers.remove.as_str();
        let r = self
            .bounded(
                session
                    .client
                    .query_one(remove, &[&row, &lease.token, &channel, &key.to_string()]),
            )
            .await?;
        Ok(r.get::<_, i64>(0) > 0)
    }
}

impl PostgresBackend {
    async fn renew_member(&self, lease: &Lease) -> Result<Renewal, LockError> {
        let (row, _, _) = self.barrier_names(&lease.key);
        let ttl = self.clamp(lease.ttl);
        let session = self.any_session().await?;
        let sent = Instant::now();
        let renew = self.statements.barriers.renew.as_str();
        let rows = self
            .bounded(
                session
                    .client
                    .query(renew, &[&row, &lease.token, &ttl_micros(ttl)]),
            )
            .await?;
        Ok(if rows.is_empty() {
            Renewal::Deleted
        } else {
            Renewal::Renewed {
                valid_until: lease_deadline(sent, ttl),
            }
        })
    }
}
