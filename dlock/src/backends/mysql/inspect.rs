//! An operator's view: `inspect`, `force_release` and `list`, read from
//! dlock's table and `IS_USED_LOCK`.
//!
//! A name held by a client that is not dlock (SQL's own `GET_LOCK`) has no
//! row naming its session: `inspect` shows it held with no holder, fence
//! or time left; `force_release` and `list` see only dlock's leases.
//! `force_release` clears the holder in the row: the holder's next
//! renewal is refused and it lets the lock go (within a third of its ttl).
//! Taking the lock from a session at once needs `KILL <session>`, which
//! ends every lock of that session, and needs the `CONNECTION ADMIN` (or
//! `SUPER`) privilege for another account's sessions; dlock never sends it.

use std::time::Duration;

use super::rows::{bytes, int, rows_of, Answer};
use super::session::{Op, Undo};
use super::{failed, MysqlBackend};
use crate::backend::holder::{holder_of, MAX_LISTED};
use crate::backend::LockBackend;
use crate::{LockError, LockInfo};

fn info(fence: Option<i64>, holder: Option<Vec<u8>>, left_us: Option<i64>) -> LockInfo {
    let holder = holder.map(|h| String::from_utf8_lossy(&h).into_owned());
    match holder {
        Some(token) => LockInfo::new(
            Duration::from_micros(left_us.and_then(|us| u64::try_from(us).ok()).unwrap_or(0)),
            fence.and_then(|f| u64::try_from(f).ok()),
            holder_of(&token).map(str::to_owned),
        ),
        None => LockInfo::new(Duration::ZERO, None, None),
    }
}

impl MysqlBackend {
    /// `sql` on any live lock session.
    pub(super) async fn read(&self, sql: String) -> Result<Answer, LockError> {
        let session = self.any_session().await?;
        let op: Op<Answer> = Box::new(move |conn| Box::pin(rows_of(conn, sql)));
        session
            .call(Some(self.config.session.timeout), op, |_| Undo::default())
            .await
            .map_err(|e| failed(&self.shown, e))
    }

    pub(super) async fn inspect_key(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let answer = self
            .read(self.statements.inspect(&self.name_of(key)))
            .await?;
        let Some(row) = answer.rows.first() else {
            return Ok(None);
        };
        let Some(holding) = int(row, 0) else {
            return Ok(None);
        };
        if int(row, 3) == Some(holding) {
            Ok(Some(info(int(row, 1), bytes(row, 2), int(row, 4))))
        } else {
            Ok(Some(info(None, None, None)))
        }
    }

    pub(super) async fn force_release_key(&self, key: &str) -> Result<bool, LockError> {
        let answer = self
            .read(self.statements.force_release(&self.name_of(key)))
            .await?;
        Ok(answer.affected > 0)
    }

    pub(super) async fn list_keys(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, LockInfo)>, LockError> {
        let start = self.key_of(prefix);
        let answer = self
            .read(self.statements.list(&start, MAX_LISTED + 1))
            .await?;
        if answer.rows.len() > MAX_LISTED {
            return Err(crate::backend::holder::too_many_to_list(
                &self.describe(),
                prefix,
            ));
        }
        let skip = self.key_of("").len();
        Ok(answer
            .rows
            .iter()
            .map(|row| {
                let key = bytes(row, 0).unwrap_or_default();
                let key = String::from_utf8_lossy(key.get(skip..).unwrap_or_default()).into_owned();
                (key, info(int(row, 1), bytes(row, 2), int(row, 3)))
            })
            .collect())
    }
}
