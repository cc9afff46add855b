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
//! that latch share that one `LISTEN` (`channel_listens.rs`), and the
//! last one to go sends `UNLISTEN` (in the background, so a dropped wait
//! leaves no subscription). A waiter listens before it reads the count, so
//! a count-down between its read and its wait is not missed. A listening
//! connection that ended is noticed by a local check every second (no
//! request): the waiters listen again on the next one and read again.

use std::sync::atomic::Ordering;
use std::time::Instant;

use async_trait::async_trait;

use super::channel_listens::LISTENER_CHECK;
use super::{keys, PostgresBackend};
use crate::backend::LatchBackend;
use crate::LockError;

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
