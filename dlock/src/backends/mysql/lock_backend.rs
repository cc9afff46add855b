//! [`LockBackend`] for [`MysqlBackend`]: the trait's calls, each handed to
//! the code that does the work.

use std::time::Instant;

use async_trait::async_trait;

use super::rows::{int, rows_of};
use super::session::Op;
use super::{failed, MysqlBackend};
use crate::backend::{AcquireRequest, Capabilities, Lease, LockBackend, Renewal};
use crate::backends::sessions;
use crate::backends::sessions::pool::PooledSession;
use crate::{LockError, LockInfo};

#[async_trait]
impl LockBackend for MysqlBackend {
    fn describe(&self) -> String {
        self.shown.clone()
    }

    fn client_name(&self) -> Option<&str> {
        Some(self.config.session.client_name())
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.try_once(req).await
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.acquire_in_turn(req, deadline).await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew_leases(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(h) = sessions::held::take_live(&self.held, &lease.token) else {
            return Ok(false);
        };
        let sql = self.statements.release(&h.lock, &lease.token);
        let op: Op<(Option<i64>, Option<i64>)> = Box::new(move |conn| {
            Box::pin(async move {
                let answer = rows_of(conn, sql).await?;
                let row = answer.rows.first();
                Ok((row.and_then(|r| int(r, 0)), row.and_then(|r| int(r, 1))))
            })
        });
        let limit = self.config.session.timeout;
        let answer = h.session.call_letting_go(limit, &h.lock, op).await;
        match answer {
            Ok((mine, released)) => {
                h.session.unreserve(&h.lock);
                let sweep = self.statements.sweep(super::retention::BATCH);
                super::retention::sweep_if_due(&self.sessions.sweeper, &h.session, sweep);
                Ok(mine == Some(1) && released == Some(1))
            }
            Err(_) if !h.session.is_alive() => Ok(false),
            Err(e) => {
                // Refused by the server (the table's read, say): the lock
                // is let go all the same, by the statement that needs no
                // table.
                super::held::unlock_in_background(h.session, h.lock);
                Err(failed(&self.shown, e))
            }
        }
    }

    /// Semaphores only: `GET_LOCK` has no shared mode (no read-write
    /// locks), and elections, latches and barriers are not built here.
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            permits: Some(self),
            ..Capabilities::default()
        }
    }

    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.sessions.alarm.subscribe())
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.inspect_key(key).await
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        self.force_release_key(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, LockInfo)>, LockError> {
        self.list_keys(prefix).await
    }
}
