//! A full lock table: PostgreSQL keeps every advisory lock of every
//! session in one shared table of about `max_locks_per_transaction ×
//! (max_connections + max_prepared_transactions)` entries (with the
//! server's default settings, 64 × 100, about 6,400 entries plus some
//! slack: roughly 11,900 locks on PostgreSQL 15), shared with the tables
//! every transaction locks. When it is full, taking one more lock fails
//! with `ERROR 53200 out of shared memory`, and so does every statement
//! that writes a row (a writing transaction locks its own id) or
//! announces a release (`NOTIFY` locks the database at commit). Such a
//! failure is the statement's alone, so the backend treats it as such and
//! never ends a session (which would free every lock it holds) for it:
//!
//! - an acquisition it refuses is an error saying which setting to raise
//!   and how much this backend holds, rather than the server's bare text
//!   (a try granted just before the fence's write failed is unlocked in
//!   the background, as a dropped attempt is);
//! - an unlock (a release, or undoing an attempt) whose announcement or
//!   row clear is refused has still unlocked: advisory unlocks are not
//!   transactional and need no room;
//! - a renewal whose row update is refused still answers from the
//!   session's locks (`own_locks`, a read, which needs no room): the
//!   leases whose locks the session holds are renewed, and the holder
//!   rows' expiry (shown by `inspect`) moves at the next round that fits.

use std::future::Future;

use tokio_postgres::error::SqlState;

use super::session::Session;
use super::{failed, lock, PostgresBackend};
use crate::LockError;

impl PostgresBackend {
    /// `fut`, an acquisition's statement, within the request timeout, its
    /// error the backend's; the server's full lock table is an error
    /// naming `max_locks_per_transaction` (see the module docs).
    pub(super) async fn bounded_acquire<T>(
        &self,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.config.session.timeout, fut).await {
            Ok(Err(e)) if is_full(&e) => Err(self.lock_table_full()),
            Ok(Err(e)) => Err(failed(&self.shown, e)),
            Ok(Ok(t)) => Ok(t),
            Err(_) => Err(self.silent()),
        }
    }

    /// The refusal of an acquisition the server's lock table has no room
    /// for, with how many locks this backend holds now.
    pub(super) fn lock_table_full(&self) -> LockError {
        let held = lock(&self.held).len();
        failed(
            &self.shown,
            format!(
                "the server's shared lock table is full (ERROR 53200 out of shared memory): \
                 it refused one more advisory lock while this backend holds {held} locks. \
                 The table holds about max_locks_per_transaction × (max_connections + \
                 max_prepared_transactions) locks for all clients together (64 × 100 by \
                 default); raise max_locks_per_transaction in postgresql.conf (it takes a \
                 server restart) or hold fewer locks at once. The leases already granted \
                 are kept"
            ),
        )
    }
}

/// Whether `e` is the server's full lock table (`ERROR 53200`).
pub(super) fn is_full(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::OUT_OF_MEMORY)
}

impl PostgresBackend {
    /// Releases the lock `key` (named `name`, held under `token`) on
    /// `session`: whether it was held there and its row named the token.
    /// A full lock table refuses only what follows the unlock (see the
    /// module docs): the lock is free, and was ours.
    pub(super) async fn release_on(
        &self,
        session: &Session,
        key: i64,
        name: &str,
        token: &str,
    ) -> Result<bool, LockError> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&key, &name, &token, &session.token];
        let sent = session.guarded(session.client.query_one(&session.prepared.release, &params));
        match tokio::time::timeout(self.config.session.timeout, sent).await {
            Ok(Ok(row)) => Ok(row.get::<_, bool>(0) && row.get::<_, i64>(1) == 1),
            Ok(Err(e)) if is_full(&e) => self.unlock_once_more(session, key).await,
            Ok(Err(e)) => Err(failed(&self.shown, e)),
            Err(_) => Err(self.silent()),
        }
    }

    /// After a release refused for want of room: the plain unlock, once
    /// more (it answers false if the release's own unlock ran), so the
    /// key is surely free before the release says so.
    async fn unlock_once_more(&self, session: &Session, key: i64) -> Result<bool, LockError> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&key, &session.token];
        let sent = session.guarded(session.client.query_one(&session.prepared.unlock, &params));
        match tokio::time::timeout(self.config.session.timeout, sent).await {
            Ok(Ok(_)) => Ok(true),
            // Refused at the announcement, after the unlock.
            Ok(Err(e)) if is_full(&e) => Ok(true),
            Ok(Err(e)) => Err(failed(&self.shown, e)),
            Err(_) => Err(self.silent()),
        }
    }
}
