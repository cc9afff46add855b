//! Every SQL statement the backend sends, built once per backend with the
//! fence table's schema quoted in.
//!
//! A bigint advisory lock shows in `pg_locks` as `classid` = its high 32 bits
//! and `objid` = its low 32 bits (both unsigned), `objsubid` = 1, in the
//! database of the session that took it: [`HELD_BY`] matches that.

/// The one channel releases are announced on; the payload is the advisory
/// key in decimal.
pub(super) const CHANNEL: &str = "dlock_released";

/// `pg_locks` rows of the advisory lock `$id` (an expression naming a
/// bigint) in this database, granted.
macro_rules! held_by {
    ($id:literal, $pid:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted",
            " AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            " AND l.classid = ((", $id, " >> 32) & 4294967295)::oid AND l.objid = (", $id, " & 4294967295)::oid",
            $pid,
            ")"
        )
    };
}

/// The statements, with the tables' names filled in.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    /// `"schema".dlock_fences`: each key's fence counter (a logged table:
    /// the counter outlives a crash).
    pub(super) table: String,
    /// `"schema".dlock_holders`: who holds each key, its fence and expiry,
    /// for `inspect`, `list`, `force_release` and the renewal's check. An
    /// unlogged table: writing it costs no WAL flush, and after a crash,
    /// when it is emptied, every session (and lock) is gone anyway.
    pub(super) holders: String,
    /// Try the lock; if granted, the next fence and the holder's row.
    /// `$1` advisory key, `$2` name, `$3` token, `$4` ttl in seconds.
    pub(super) acquire: String,
    /// Which of `$1` keys (names `$2`, tokens `$3`, ttls `$4`) this session
    /// still holds, and whether the holder row still names the token.
    pub(super) renew: String,
    /// Clear the holder row of `$2` if it names `$3`, then unlock `$1` and
    /// announce. The row goes first: cleared after the unlock, it could
    /// meet the next holder's row and leave it alone.
    pub(super) release: String,
    /// Unlock `$1` and announce, whatever the row says.
    pub(super) unlock: String,
    /// `$1` name: fence, holder token, seconds left, whether held by anyone.
    pub(super) inspect: String,
    /// Clears the holder row of `$1` (name) if its key is held: the holder's
    /// next renewal is refused.
    pub(super) force_release: String,
    /// The held rows whose name starts with `$1`, by name, at most `$2`.
    pub(super) list: String,
}

impl Statements {
    pub(super) fn new(schema: &str) -> Self {
        let table = format!("\"{schema}\".dlock_fences");
        let holders = format!("\"{schema}\".dlock_holders");
        let held_by_me = held_by!("a.id", " AND l.pid = pg_backend_pid()");
        let held_by_anyone = held_by!("h.lock_id", "");
        Statements {
            acquire: format!(
                "WITH got AS (SELECT pg_try_advisory_lock($1::int8) AS ok), \
                 fence AS (INSERT INTO {table} AS f (name, counter) SELECT $2::text, 1 FROM got WHERE ok \
                   ON CONFLICT (name) DO UPDATE SET counter = f.counter + 1 RETURNING counter), \
                 who AS (INSERT INTO {holders} AS h (name, lock_id, fence, holder, expires) \
                   SELECT $2::text, $1::int8, fence.counter, $3::text, clock_timestamp() + make_interval(secs => $4::float8) FROM fence \
                   ON CONFLICT (name) DO UPDATE SET lock_id = EXCLUDED.lock_id, fence = EXCLUDED.fence, \
                   holder = EXCLUDED.holder, expires = EXCLUDED.expires RETURNING 1) \
                 SELECT (SELECT ok FROM got), (SELECT counter FROM fence), (SELECT count(*) FROM who)"
            ),
            renew: format!(
                "WITH asked AS (SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::float8[]) AS a(id, name, token, secs)), \
                 held AS (SELECT a.* FROM asked a WHERE {held_by_me}), \
                 ours AS (UPDATE {holders} h SET expires = clock_timestamp() + make_interval(secs => k.secs) \
                   FROM held k WHERE h.name = k.name AND h.holder = k.token RETURNING h.name) \
                 SELECT k.name, EXISTS (SELECT 1 FROM ours o WHERE o.name = k.name) FROM held k"
            ),
            release: format!(
                "WITH c AS (UPDATE {holders} SET holder = NULL, expires = NULL \
                   WHERE name = $2::text AND holder = $3::text RETURNING 1), \
                 u AS (SELECT pg_advisory_unlock($1::int8) AS ok, x.n FROM (SELECT count(*) AS n FROM c) x), \
                 n AS (SELECT pg_notify('{CHANNEL}', $1::int8::text) FROM u WHERE ok) \
                 SELECT (SELECT ok FROM u), (SELECT n FROM u), (SELECT count(*) FROM n)"
            ),
            unlock: format!(
                "WITH u AS (SELECT pg_advisory_unlock($1::int8) AS ok), \
                 n AS (SELECT pg_notify('{CHANNEL}', $1::int8::text) FROM u WHERE ok) \
                 SELECT (SELECT ok FROM u), (SELECT count(*) FROM n)"
            ),
            inspect: format!(
                "SELECT h.fence, h.holder, \
                   GREATEST(0, EXTRACT(EPOCH FROM h.expires - clock_timestamp()))::float8, \
                   {held_by_anyone} \
                 FROM {holders} h WHERE h.name = $1::text"
            ),
            force_release: format!(
                "UPDATE {holders} h SET holder = NULL, expires = NULL \
                 WHERE h.name = $1::text AND h.holder IS NOT NULL AND {held_by_anyone} RETURNING 1"
            ),
            list: format!(
                "SELECT h.name, h.fence, h.holder, \
                   GREATEST(0, EXTRACT(EPOCH FROM h.expires - clock_timestamp()))::float8 \
                 FROM {holders} h WHERE h.holder IS NOT NULL AND starts_with(h.name, $1::text) AND {held_by_anyone} \
                 ORDER BY h.name LIMIT $2::int8"
            ),
            table,
            holders,
        }
    }

    /// Creates the two tables if they are missing.
    pub(super) fn create_tables(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, counter bigint NOT NULL); \
             CREATE UNLOGGED TABLE IF NOT EXISTS {} (name text PRIMARY KEY, lock_id bigint NOT NULL, \
             fence bigint NOT NULL, holder text, expires timestamptz)",
            self.table, self.holders
        )
    }
}
