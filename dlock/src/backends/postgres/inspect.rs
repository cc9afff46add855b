//! An operator's view: `inspect`, `force_release` and `list`, read from the
//! fence table's rows joined with `pg_locks`.
//!
//! A key held by a client that is not dlock (psql's `pg_advisory_lock`) has
//! no row naming a holder: `inspect` shows it held with no holder, fence
//! or time left; `force_release` and `list` see only dlock's leases.

use std::time::Duration;

use super::PostgresBackend;
use crate::backend::holder::{holder_of, MAX_LISTED};
use crate::backend::LockBackend;
use crate::{LockError, LockInfo};

/// Seconds as a duration, never panicking on odd values.
fn seconds(secs: Option<f64>) -> Duration {
    secs.filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| Duration::from_secs_f64(s.min(1e9)))
        .unwrap_or(Duration::ZERO)
}

fn info(counter: Option<i64>, holder: Option<&str>, secs: Option<f64>) -> LockInfo {
    match holder {
        Some(token) => LockInfo::new(
            seconds(secs),
            counter.and_then(|c| u64::try_from(c).ok()),
            holder_of(token).map(str::to_owned),
        ),
        None => LockInfo::new(Duration::ZERO, None, None),
    }
}

impl PostgresBackend {
    pub(super) async fn inspect_key(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let session = self.any_session().await?;
        let name = self.name_of(key);
        let id = super::advisory_key_in(&self.config.prefix, key);
        let rows = self
            .bounded(session.client.query(&self.statements.inspect, &[&name]))
            .await?;
        match rows.first() {
            Some(row) if row.get::<_, bool>(3) => Ok(Some(info(
                row.get(0),
                row.get::<_, Option<&str>>(1),
                row.get(2),
            ))),
            Some(_) => Ok(None),
            // No row: held only if a foreign client holds the key.
            None => {
                let held: bool = self
                    .bounded(session.client.query_one(
                        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
                         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                         AND classid = (($1::int8 >> 32) & 4294967295)::oid AND objid = ($1::int8 & 4294967295)::oid)",
                        &[&id],
                    ))
                    .await?
                    .get(0);
                Ok(held.then(|| info(None, None, None)))
            }
        }
    }

    pub(super) async fn force_release_key(&self, key: &str) -> Result<bool, LockError> {
        let session = self.any_session().await?;
        let name = self.name_of(key);
        let rows = self
            .bounded(
                session
                    .client
                    .query(&self.statements.force_release, &[&name]),
            )
            .await?;
        Ok(!rows.is_empty())
    }

    pub(super) async fn list_keys(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, LockInfo)>, LockError> {
        let session = self.any_session().await?;
        let start = self.name_of(prefix);
        let limit = i64::try_from(MAX_LISTED + 1).unwrap_or(i64::MAX);
        let rows = self
            .bounded(
                session
                    .client
                    .query(&self.statements.list, &[&start, &limit]),
            )
            .await?;
        if rows.len() > MAX_LISTED {
            return Err(crate::backend::holder::too_many_to_list(
                &self.describe(),
                prefix,
            ));
        }
        let skip = self.name_of("").len();
        Ok(rows
            .iter()
            .map(|row| {
                let name: &str = row.get(0);
                (
                    name.get(skip..).unwrap_or_default().to_owned(),
                    info(row.get(1), row.get::<_, Option<&str>>(2), row.get(3)),
                )
            })
            .collect())
    }
}
