//! Leader election on PostgreSQL: the election `name` is the plain lock of
//! that name (its advisory key, its fence as the term); the leader's record
//! is the row `<prefix>:<name>` of the unlogged table
//! `<schema>.dlock_leaders` (created on the first use of an election),
//! naming the lease's token, the session that wrote it, the term and the
//! value.
//!
//! - `proclaim` writes the record on the session that holds the lock, in
//!   one statement that checks that this session holds it and that the
//!   holder row still names the lease's token (so a lease that was
//!   force-released, or a session that was ended, writes nothing).
//! - `leader` answers a record only while the session that wrote it still
//!   holds the lock and the holder row still names its token: a crashed
//!   leader's record stops counting when its session ends.
//! - Every change is announced on the channel `dlock_elected`, heard on the
//!   backend's one `LISTEN` connection (the lock waiters'): the payload is
//!   the election's advisory key and the announcement
//!   (`backends::announcements`: the term and value, or the end of a
//!   term), kept in each observer's inbox. Any role that may connect may
//!   `NOTIFY` on that channel, so an announcement is only a hint: the
//!   observer reads the leader for each one and reports what the read
//!   shows (a term that began and ended between two reads is not
//!   reported; its successor is). `NOTIFY` payloads are capped at 8,000 bytes, hence
//!   [`MAX_VALUE_BYTES`] (7,900) for values.
//!
//! A record left by a leader that crashed stays (one row per election
//! name) until the next leader overwrites it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{advisory_key_in, failed, lock, PostgresBackend};
use crate::backend::{ElectionBackend, Leader, LeaderChange, LeaderChanges, Lease};
use crate::backends::announcements::Inbox;
use crate::backends::sessions::pool::PooledSession;
use crate::LockError;

/// How often an observer checks that the listening connection still runs
/// (a local check, no request).
const LISTENER_CHECK: Duration = Duration::from_secs(1);

impl PostgresBackend {
    /// Creates the leaders' table on the first use of an election; a clear
    /// error when the role may not, or when another role owns it.
    async fn ensure_leaders(&self) -> Result<(), LockError> {
        if self.leaders_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let (table, create) = (&self.statements.leaders, &self.statements.elections.create);
        self.ensure_table_of(table, create, "leader elections")
            .await?;
        self.leaders_ready.store(true, Ordering::Release);
        Ok(())
    }
}

/// One observer's inbox of an election's announcements.
struct Changes {
    inbox: Arc<Inbox>,
    /// The listening connection's: false once it ended.
    listening: Arc<AtomicBool>,
}

#[async_trait]
impl LeaderChanges for Changes {
    async fn changed(&mut self) -> LeaderChange {
        loop {
            tokio::select! {
                change = self.inbox.next() => return change,
                () = tokio::time::sleep(LISTENER_CHECK) => {
                    if !self.listening.load(Ordering::SeqCst) {
                        // News may have been missed: the caller watches anew.
                        return LeaderChange::Closed;
                    }
                }
            }
        }
    }
}

/// The longest value a PostgreSQL leader publishes: its announcement
/// (`NOTIFY`, whose payload PostgreSQL caps at 8,000 bytes) carries it
/// beside the election's key and the term. A longer value is refused by
/// `campaign` and `proclaim` with `InvalidOption`.
///
/// ```
/// assert!(dlock::backends::postgres::MAX_VALUE_BYTES < 8_000);
/// ```
pub const MAX_VALUE_BYTES: usize = 7_900;

#[async_trait]
impl ElectionBackend for PostgresBackend {
    fn max_value_bytes(&self) -> usize {
        MAX_VALUE_BYTES
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool, LockError> {
        // A `text` value cannot hold NUL: refused before any server work,
        // not as the server's 22021 after the term was drawn.
        if value.contains('\0') {
            return Err(LockError::invalid_option(format!(
                "the value of election `{}` contains a NUL byte, which PostgreSQL's `text` cannot store; publish an address or a name without it",
                lease.key
            )));
        }
        let Some(term) = lease.fencing_token.and_then(|t| i64::try_from(t).ok()) else {
            return Ok(false);
        };
        self.ensure_leaders().await?;
        let Some((session, key)) = lock(&self.held)
            .get(&lease.token)
            .map(|h| (h.session.clone(), h.lock.key))
        else {
            return Ok(false);
        };
        if !session.is_alive() {
            return Ok(false);
        }
        let name = self.name_of(&lease.key);
        let statement = &self.statements.elections.proclaim;
        let row = self
            .bounded(session.guarded(session.client.query_one(
                statement.as_str(),
                &[&key, &name, &lease.token, &term, &value, &session.token],
            )))
            .await?;
        Ok(row.get::<_, i64>(0) == 1)
    }

    async fn withdraw(&self, lease: &Lease) -> Result<(), LockError> {
        self.ensure_leaders().await?;
        let session = self.any_session().await?;
        let key = advisory_key_in(&self.config.prefix, &lease.key);
        let name = self.name_of(&lease.key);
        let statement = &self.statements.elections.withdraw;
        self.bounded(
            session
                .client
                .query_one(statement.as_str(), &[&key, &name, &lease.token]),
        )
        .await?;
        Ok(())
    }

    async fn leader(&self, name: &str) -> Result<Option<Leader>, LockError> {
        self.ensure_leaders().await?;
        let session = self.any_session().await?;
        let statement = &self.statements.elections.leader;
        let rows = self
            .bounded(
                session
                    .client
                    .query(statement.as_str(), &[&self.name_of(name)]),
            )
            .await?;
        Ok(rows.first().and_then(|row| {
            let term = u64::try_from(row.get::<_, i64>(0)).ok()?;
            Some(Leader {
                value: row.get(1),
                term,
            })
        }))
    }

    async fn watch(&self, name: &str) -> Result<Box<dyn LeaderChanges>, LockError> {
        let key = advisory_key_in(&self.config.prefix, name);
        let inbox = self.waiters.watch(key);
        if !self.ensure_listener().await {
            return Err(failed(
                &self.shown,
                "the connection that listens for announcements could not be opened",
            ));
        }
        let listening = match self.listener.lock().await.as_ref() {
            Some(listener) => listener.alive_flag(),
            None => Arc::new(AtomicBool::new(false)),
        };
        inbox.settle();
        Ok(Box::new(Changes { inbox, listening }))
    }

    /// Never: any role that may connect may `NOTIFY dlock_elected` with any
    /// text, and nothing on the server keeps what was announced, so an
    /// observer reads the leader for every announcement instead (a term
    /// over before that read is not reported).
    async fn confirm(&self, name: &str, change: &LeaderChange) -> Result<bool, LockError> {
        let _ = (name, change);
        Ok(false)
    }
}
