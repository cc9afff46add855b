//! Every SQL statement the backend sends, with the table's name quoted in
//! (`` `database`.`dlock_fences` ``) and every name, key and token as a
//! hexadecimal literal (`names::hex_literal`): nothing user-given is ever
//! spliced as text.
//!
//! The table holds one row per lock name: the key it is for, its fencing
//! counter, and the last holder (owner token, the holding session's
//! `CONNECTION_ID()`, ttl, last renewal). A row's holder counts only while
//! `IS_USED_LOCK(name)` names that session: a released lock needs no write.
//! A fence is `GREATEST(last + 1, the server's clock in µs)` ([`NOW_US`]),
//! so a row forgotten after `?fence_retention=` restarts above every fence
//! before it.

use std::time::Duration;

use super::names::hex_literal;

/// The server's clock in µs since the epoch (sessions run in UTC): the
/// floor of every fence.
pub(super) const NOW_US: &str = "CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)";

/// The table's name (created if missing, see `setup.rs`).
pub(super) const TABLE: &str = "dlock_fences";

/// The longest wait `GET_LOCK` is given for "no limit", in seconds (a
/// year: MariaDB refuses a negative timeout, MySQL's "forever").
const FOREVER_SECS: u64 = 31_536_000;

/// The statements, with the table's name filled in.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    /// `` `database`.`dlock_fences` ``.
    pub(super) table: String,
    retention_us: i64,
}

/// A `GET_LOCK` wait in the queue: a limit, or none at all.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wait {
    /// At most this long.
    For(Duration),
    /// Until granted.
    Forever,
}

impl Wait {
    pub(super) fn seconds(self) -> String {
        match self {
            Wait::For(d) => format!("{:.3}", d.as_secs_f64().clamp(0.001, FOREVER_SECS as f64)),
            Wait::Forever => FOREVER_SECS.to_string(),
        }
    }
}

/// `identifier` quoted for MySQL (`` ` `` doubled).
pub(super) fn quote(identifier: &str) -> String {
    format!("`{}`", identifier.replace('`', "``"))
}

impl Statements {
    pub(super) fn new(database: &str, retention: Duration) -> Self {
        Statements {
            table: format!("{}.{}", quote(database), quote(TABLE)),
            retention_us: i64::try_from(retention.as_micros()).unwrap_or(i64::MAX),
        }
    }

    /// Creates the table if it is missing.
    pub(super) fn create(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               name VARBINARY(256) NOT NULL PRIMARY KEY, \
               lock_key VARBINARY(768) NOT NULL, \
               fence BIGINT NOT NULL, \
               holder VARBINARY(200) NULL, \
               conn BIGINT UNSIGNED NULL, \
               ttl_ms BIGINT NOT NULL DEFAULT 0, \
               renewed_us BIGINT NOT NULL DEFAULT 0\
             ) ENGINE=InnoDB",
            self.table
        )
    }

    /// Tries the lock `name` (`GET_LOCK(name, 0)`) and, if granted, the
    /// next fence and the holder's row, in one round trip. Answers one row:
    /// `GET_LOCK`'s answer (1 granted, 0 held by another session, NULL
    /// error) and the fence (meaningful only when granted). Never sent
    /// where a kill may land: it is several statements (`cancel.rs`).
    pub(super) fn acquire(&self, name: &str, key: &str, token: &str, ttl: Duration) -> String {
        format!(
            "SET @dlock_got = GET_LOCK({n}, 0); {upsert}; \
             SELECT @dlock_got, IF(@dlock_got = 1, LAST_INSERT_ID(), NULL)",
            n = hex_literal(name.as_bytes()),
            upsert = self.holder_row(name, key, token, ttl, "WHERE @dlock_got = 1"),
        )
    }

    /// The next fence and the holder's row of `name`, which the session
    /// was just granted by a wait in the queue: one statement, whose
    /// answer carries the fence as its insert id (`LAST_INSERT_ID(expr)`).
    pub(super) fn record_grant(&self, name: &str, key: &str, token: &str, ttl: Duration) -> String {
        self.holder_row(name, key, token, ttl, "")
    }

    /// The `INSERT` that raises `name`'s fence (to its last plus one, or
    /// the clock in µs if later; `LAST_INSERT_ID` is set to it) and names
    /// the holder, if `condition` holds.
    fn holder_row(
        &self,
        name: &str,
        key: &str,
        token: &str,
        ttl: Duration,
        condition: &str,
    ) -> String {
        let (n, k, t) = (
            hex_literal(name.as_bytes()),
            hex_literal(key.as_bytes()),
            hex_literal(token.as_bytes()),
        );
        let ttl_ms = ttl.as_millis().min(i64::MAX as u128);
        format!(
            "INSERT INTO {table} (name, lock_key, fence, holder, conn, ttl_ms, renewed_us) \
               SELECT {n}, {k}, LAST_INSERT_ID({NOW_US}), {t}, CONNECTION_ID(), {ttl_ms}, {NOW_US} FROM DUAL \
               {condition} \
             ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence + 1, VALUES(renewed_us))), \
               lock_key = VALUES(lock_key), holder = VALUES(holder), conn = VALUES(conn), \
               ttl_ms = VALUES(ttl_ms), renewed_us = VALUES(renewed_us)",
            table = self.table,
        )
    }

    /// Lets the lock `name` go. Answers (whether the row named `token`
    /// before, `RELEASE_LOCK`'s answer: 1 released, 0 held by another
    /// session, NULL not held).
    pub(super) fn release(&self, name: &str, token: &str) -> String {
        let n = hex_literal(name.as_bytes());
        format!(
            "SELECT (SELECT holder FROM {table} WHERE name = {n}) <=> {t}, RELEASE_LOCK({n})",
            table = self.table,
            t = hex_literal(token.as_bytes()),
        )
    }

    /// Lets the lock `name` go, whatever the row says.
    pub(super) fn unlock(name: &str) -> String {
        format!("DO RELEASE_LOCK({})", hex_literal(name.as_bytes()))
    }

    /// The renewal of `leases` (name, token) held through one session: the
    /// rows' renewal time moved, then one row with two columns per lease:
    /// whether the session still holds the name, and whether the row still
    /// names the token.
    pub(super) fn renew(&self, leases: &[(&str, &str)]) -> String {
        let names: Vec<String> = leases
            .iter()
            .map(|(n, _)| hex_literal(n.as_bytes()))
            .collect();
        let mut checks = Vec::with_capacity(leases.len());
        for ((_, token), n) in leases.iter().zip(&names) {
            checks.push(format!(
                "IS_USED_LOCK({n}) <=> CONNECTION_ID(), (SELECT holder FROM {table} WHERE name = {n}) <=> {t}",
                table = self.table,
                t = hex_literal(token.as_bytes()),
            ));
        }
        format!(
            "UPDATE {table} SET renewed_us = {NOW_US} WHERE name IN ({names}) AND conn = CONNECTION_ID(); \
             SELECT {checks}",
            table = self.table,
            names = names.join(", "),
            checks = checks.join(", "),
        )
    }

    /// `name`'s holder: (the holding session or NULL, fence, holder token,
    /// the row's session, µs left of its ttl); always one row.
    pub(super) fn inspect(&self, name: &str) -> String {
        let n = hex_literal(name.as_bytes());
        format!(
            "SELECT IS_USED_LOCK({n}), f.fence, f.holder, f.conn, \
               f.ttl_ms * 1000 - ({NOW_US} - f.renewed_us) \
             FROM (SELECT 1) d LEFT JOIN {table} f ON f.name = {n}",
            table = self.table,
        )
    }

    /// Clears the holder of `name` if a dlock lease holds it: the holder's
    /// next renewal is refused (and it lets the lock go). The affected rows
    /// say whether a lease was removed.
    pub(super) fn force_release(&self, name: &str) -> String {
        let n = hex_literal(name.as_bytes());
        format!(
            "UPDATE {table} SET holder = NULL WHERE name = {n} AND holder IS NOT NULL \
               AND conn <=> IS_USED_LOCK({n})",
            table = self.table,
        )
    }

    /// The held dlock leases whose key starts with `start`, by key, at
    /// most `limit`: (key, fence, holder, µs left).
    pub(super) fn list(&self, start: &str, limit: usize) -> String {
        format!(
            "SELECT lock_key, fence, holder, ttl_ms * 1000 - ({NOW_US} - renewed_us) FROM {table} \
             WHERE LEFT(lock_key, {len}) = {s} AND holder IS NOT NULL AND conn <=> IS_USED_LOCK(name) \
             ORDER BY lock_key LIMIT {limit}",
            table = self.table,
            len = start.len(),
            s = hex_literal(start.as_bytes()),
        )
    }

    /// Deletes up to `batch` rows idle past the retention whose lock
    /// nobody holds.
    pub(super) fn sweep(&self, batch: u32) -> String {
        format!(
            "DELETE FROM {table} WHERE fence < {NOW_US} - {r} AND renewed_us < {NOW_US} - {r} \
               AND IS_USED_LOCK(name) IS NULL LIMIT {batch}",
            table = self.table,
            r = self.retention_us,
        )
    }
}
