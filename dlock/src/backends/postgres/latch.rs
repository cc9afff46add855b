//! Count-down latches on PostgreSQL: the count of the latch `name` is the
//! row `<prefix>:<name>` of the table `<schema>.dlock_latches` (created on
//! the first use of a latch, as the leaders' table is), which exists only
//! while the count is live: the count-down that reaches zero deletes it.
//! One statement each (`sql.rs`'s `LatchStatements`): `set` inserts the
//! row where none is; `count_down` locks the row (`FOR UPDATE`, so that
//! concurrent count-downs each see the last one's count), then takes one
//! from it or deletes it at one, and announces the zero with `NOTIFY` on
//! the latch's own channel ([`channel_of`]); `read` answers 0 without a row.
//!
//! Waiters are woken by that `NOTIFY`, heard on the backend's one listening
//! connection (`listener.rs`, the lock waiters'): the first waiter of a
//! latch in this process sends `LISTEN "<channel>"` on it, the others of
//! that latch share that one `LISTEN` (a [`Listened`] they hold), and the
//! last one to go sends `UNLISTEN` (in the background, so a dropped wait
//! leaves no subscription). A waiter listens before it reads the count, so
//! a count-down between its read and its wait is not missed. A listening
//! connection that ended is noticed by a local check every second (no
//! request): the waiters listen again on the next one and read again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::{failed, keys, lock, PostgresBackend};
use crate::backend::LatchBackend;
use crate::LockError;

/// How often a waiter checks that the listening connection still runs (a
/// local check, no request).
pub(super) const LISTENER_CHECK: Duration = Duration::from_secs(1);

/// The bound on a background `UNLISTEN` (a listener that does not answer
/// is one that ends, and its `LISTEN`s with it).
const UNLISTEN_BOUND: Duration = Duration::from_secs(5);

/// The `NOTIFY` channel of the latch `name` under `prefix`: `dlock_latch_`
/// and 16 hex digits of SHA-256 of `latch<TAB><prefix>:<name>` (a channel is
/// an identifier of at most 63 bytes; the name may be longer or hold any
/// character).
pub(super) fn channel_of(prefix: &str, name: &str) -> String {
    format!("dlock_latch_{:016x}", wake_key(prefix, name) as u64)
}

/// The number the latch's waiters are registered under in the listener's
/// `Waiters` (and the payload of its `NOTIFY`): a digest apart from the
/// advisory keys' (a tab cannot be in a prefix's key).
fn wake_key(prefix: &str, name: &str) -> i64 {
    let digest = keys::digest(&format!("latch\t{prefix}"), name);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The `LISTEN`s of latches, one per latch with waiters in this process.
#[derive(Debug, Default)]
pub(super) struct LatchListens {
    by_key: Mutex<HashMap<i64, Weak<Listened>>>,
    /// Held while a `LISTEN` or `UNLISTEN` is decided and sent, so that an
    /// `UNLISTEN` of a latch's last waiter never lands after the `LISTEN`
    /// of a waiter that came next.
    order: tokio::sync::Mutex<()>,
}

/// One channel's `LISTEN` (a latch's, a barrier's), shared by its
/// waiters; the last one's drop sends `UNLISTEN`.
pub(super) struct Listened {
    key: i64,
    channel: String,
    /// The alive flag of the listening connection the `LISTEN` went out on;
    /// set once it was answered.
    on: OnceCell<Arc<AtomicBool>>,
    listens: Arc<LatchListens>,
    listener: Arc<tokio::sync::Mutex<Option<super::listener::Listener>>>,
}

impl Listened {
    /// Whether the `LISTEN` was answered on a listening connection that
    /// still runs.
    pub(super) fn listening(&self) -> bool {
        self.on.get().is_some_and(|a| a.load(Ordering::SeqCst))
    }
}

impl Drop for Listened {
    fn drop(&mut self) {
        let (key, channel) = (self.key, self.channel.clone());
        let (listens, listener) = (self.listens.clone(), self.listener.clone());
        crate::lease::background::spawn(async move {
            let _order = listens.order.lock().await;
            {
                let mut map = lock(&listens.by_key);
                if map.get(&key).and_then(Weak::upgrade).is_some() {
                    // Another waiter came meanwhile: its `LISTEN` stands.
                    return;
                }
                map.remove(&key);
            }
            if let Some(l) = listener.lock().await.as_ref().filter(|l| l.is_alive()) {
                let unlisten = format!("UNLISTEN \"{channel}\"");
                let _ = tokio::time::timeout(UNLISTEN_BOUND, l.run(&unlisten)).await;
            }
        });
    }
}

impl PostgresBackend {
    /// The row's name of the latch `name`: `<prefix>:<name>`.
    fn latch_row(&self, name: &str) -> String {
        self.name_of(name)
    }

    /// Creates the latches' table on the first use of a latch; a clear
    /// error when the role may not, or when another role owns it.
    async fn ensure_latches(&self) -> Result<(), LockError> {
        if self.latches_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let table = &self.statements.latches.table;
        let create = &self.statements.latches.create;
        self.ensure_table_of(table, create, "count-down latches")
            .await?;
        self.latches_ready.store(true, Ordering::Release);
        Ok(())
    }

    /// The shared `LISTEN` on `channel` (a latch's or a barrier's, whose
    /// waiters are registered under `key`) on a live listening connection,
    /// sent if this is its first waiter.
    pub(super) async fn listen_on(
        &self,
        key: i64,
        channel: &str,
    ) -> Result<Arc<Listened>, LockError> {
        let listened = {
            let mut map = lock(&self.latch_listens.by_key);
            match map
                .get(&key)
                .and_then(Weak::upgrade)
                .filter(|l| l.on.get().is_none() || l.listening())
            {
                Some(listened) => listened,
                None => {
                    let listened = Arc::new(Listened {
                        key,
                        channel: channel.to_owned(),
                        on: OnceCell::new(),
                        listens: self.latch_listens.clone(),
                        listener: self.listener.clone(),
                    });
                    map.insert(key, Arc::downgrade(&listened));
                    listened
                }
            }
        };
        listened
            .on
            .get_or_try_init(|| async {
                if !self.ensure_listener().await {
                    return Err(failed(
                        &self.shown,
                        "the connection that listens for latches' zeros could not be opened",
                    ));
                }
                let _order = self.latch_listens.order.lock().await;
                let slot = self.listener.lock().await;
                let Some(listener) = slot.as_ref().filter(|l| l.is_alive()) else {
                    return Err(failed(&self.shown, "the listening connection ended"));
                };
                let flag = listener.alive_flag();
                self.bounded(listener.run(&format!("LISTEN \"{channel}\"")))
                    .await?;
                Ok(flag)
            })
            .await?;
        Ok(listened)
    }

    /// Creates the table `table` with `create` if it is missing (asked
    /// first: `CREATE … IF NOT EXISTS` needs the CREATE right even when the
    /// table is there), and refuses it when a role dlock does not trust
    /// owns it (its triggers would run as dlock's role).
    pub(super) async fn ensure_table_of(
        &self,
        table: &str,
        create: &str,
        what: &str,
    ) -> Result<(), LockError> {
        let session = self.any_session().await?;
        let exists: bool = self
            .bounded(
                session
                    .client
                    .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&table]),
            )
            .await?
            .get(0);
        let created = async {
            if exists {
                Ok(())
            } else {
                super::setup::create_if_missing(&session.client, create).await
            }
        };
        match tokio::time::timeout(self.config.session.timeout, created).await {
            Err(_) => return Err(self.silent()),
            Ok(Ok(())) => {}
            Ok(Err(e))
                if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) =>
            {
                return Err(LockError::invalid_option(format!(
                    "`{shown}`: the table {table} of {what} is missing and this role may not create it ({e}); \
                     have a role this one is a member of (or a superuser) run `{create}` and `GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO <role>`",
                    shown = self.shown,
                    e = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned()),
                )));
            }
            Ok(Err(e)) => return Err(failed(&self.shown, e)),
        }
        let table = table.to_owned();
        let (config, shown) = (&self.config, &self.shown);
        super::setup::check_owners(&session.client, config, &config.schema, &[&table], shown).await
    }

    async fn latch_read(&self, row: &str) -> Result<u64, LockError> {
        let session = self.any_session().await?;
        let count: i64 = self
            .bounded(
                session
                    .client
                    .query_one(self.statements.latches.read.as_str(), &[&row]),
            )
            .await?
            .get(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }
}

#[async_trait]
impl LatchBackend for PostgresBackend {
    async fn try_set_count(&self, name: &str, count: u64) -> Result<bool, LockError> {
        let count = i64::try_from(count).map_err(|_| {
            LockError::invalid_option(format!("the count {count} of latch `{name}` is too large"))
        })?;
        self.ensure_latches().await?;
        let session = self.any_session().await?;
        let row = self.latch_row(name);
        let rows = self
            .bounded(
                session
                    .client
                    .query(self.statements.latches.set.as_str(), &[&row, &count]),
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn count_down(&self, name: &str) -> Result<(), LockError> {
        self.ensure_latches().await?;
        let session = self.any_session().await?;
        let row = self.latch_row(name);
        let key = wake_key(&self.config.prefix, name);
        let channel = channel_of(&self.config.prefix, name);
        self.bounded(session.client.query_one(
            self.statements.latches.count_down.as_str(),
            &[&row, &channel, &key.to_string()],
        ))
        .await?;
        Ok(())
    }

    async fn count(&self, name: &str) -> Result<u64, LockError> {
        self.ensure_latches().await?;
        self.latch_read(&self.latch_row(name)).await
    }

    async fn wait_zero(&self, name: &str, deadline: Option<Instant>) -> Result<bool, LockError> {
        self.ensure_latches().await?;
        let row = self.latch_row(name);
        if self.latch_read(&row).await? == 0 {
            return Ok(true);
        }
        let key = wake_key(&self.config.prefix, name);
        let channel = channel_of(&self.config.prefix, name);
        let waited = crate::backend::deadline::until(deadline, async {
            let waiting = self.waiters.register(key);
            loop {
                // Listening before the read: a zero after it is not missed.
                let listened = self.listen_on(key, &channel).await?;
                let notified = waiting.notify.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                if self.latch_read(&row).await? == 0 {
                    return Ok::<(), LockError>(());
                }
                loop {
                    tokio::select! {
                        () = &mut notified => break,
                        () = tokio::time::sleep(LISTENER_CHECK) => {
                            if !listened.listening() {
                                // News may have been missed: listen anew, read again.
                                break;
                            }
                        }
                    }
                }
            }
        })
        .await;
        match waited {
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }
}
