//! The SQL of PostgreSQL's double barriers (`barrier.rs`), apart from
//! their logic so that `sql.rs`, which prepares every statement, needs
//! nothing of the barrier's code.

/// The statements of barriers on `"schema".dlock_barriers`. Parameters:
/// `$1` the row name `<prefix>:<name>`, `$2` the member's token, then the
/// ttl in µs, the channel and the payload where they are used.
#[derive(Debug, Clone)]
pub(super) struct BarrierStatements {
    /// `"schema".dlock_barriers`.
    pub(super) table: String,
    /// Creates the barriers' table if it is missing.
    pub(super) create: String,
    /// Puts (or refreshes) the member `$2` with the ttl `$3`, deletes
    /// expired members, announces an arrival (`$4`, `$5`); answers the
    /// other live members, whether `ready` is there, and µs to the
    /// earliest other member's expiry.
    pub(super) arrive: String,
    /// Puts `ready`, announced (`$2`, `$3`) if it was not there.
    pub(super) open: String,
    /// Deletes a `ready` left over with no live member but `$2`,
    /// announced (`$3`, `$4`).
    pub(super) close_stale: String,
    /// Deletes expired members; answers the live ones and µs to the
    /// earliest expiry; with none, deletes `ready`, announced (`$2`, `$3`).
    pub(super) left: String,
    /// Deletes the member `$2`, announced (`$3`, `$4`); answers 1 if it
    /// was there.
    pub(super) remove: String,
    /// Moves the expiry of the live member `$2` to the ttl `$3` from now;
    /// a row if it was live.
    pub(super) renew: String,
}

impl BarrierStatements {
    pub(super) fn new(schema: &str) -> Self {
        let t = format!("\"{schema}\".dlock_barriers");
        let live = "name = $1::text AND member <> '' AND expires > clock_timestamp()";
        let expired = "name = $1::text AND member <> '' AND expires <= clock_timestamp()";
        let micros = "(extract(epoch FROM min(expires) - clock_timestamp()) * 1000000)::int8";
        BarrierStatements {
            create: format!(
                "CREATE UNLOGGED TABLE IF NOT EXISTS {t} (name text NOT NULL, member text NOT NULL, \
                 expires timestamptz NOT NULL, PRIMARY KEY (name, member))"
            ),
            arrive: format!(
                "WITH dead AS (DELETE FROM {t} WHERE {expired} AND member <> $2::text RETURNING 1), \
                 me AS (INSERT INTO {t} AS m (name, member, expires) \
                   VALUES ($1::text, $2::text, clock_timestamp() + $3::int8 * interval '1 microsecond') \
                   ON CONFLICT (name, member) DO UPDATE SET expires = EXCLUDED.expires \
                   RETURNING (m.xmax = 0) AS added), \
                 told AS (SELECT pg_notify($4::text, $5::text) FROM me WHERE added) \
                 SELECT (SELECT count(*) FROM {t} WHERE {live} AND member <> $2::text), \
                   EXISTS (SELECT 1 FROM {t} WHERE name = $1::text AND member = ''), \
                   (SELECT {micros} FROM {t} WHERE {live} AND member <> $2::text), \
                   (SELECT count(*) FROM told), (SELECT count(*) FROM dead)"
            ),
            open: format!(
                "WITH o AS (INSERT INTO {t} (name, member, expires) VALUES ($1::text, '', 'infinity') \
                   ON CONFLICT (name, member) DO NOTHING RETURNING 1) \
                 SELECT count(*) FROM (SELECT pg_notify($2::text, $3::text) FROM o) n"
            ),
            close_stale: format!(
                "WITH c AS (DELETE FROM {t} WHERE name = $1::text AND member = '' AND NOT EXISTS \
                   (SELECT 1 FROM {t} WHERE {live} AND member <> $2::text) RETURNING 1) \
                 SELECT count(*) FROM (SELECT pg_notify($3::text, $4::text) FROM c) n"
            ),
            left: format!(
                "WITH dead AS (DELETE FROM {t} WHERE {expired} RETURNING 1), \
                 seen AS (SELECT count(*) AS n, {micros} AS next FROM {t} WHERE {live}), \
                 closed AS (DELETE FROM {t} WHERE name = $1::text AND member = '' \
                   AND (SELECT n FROM seen) = 0 RETURNING 1), \
                 told AS (SELECT pg_notify($2::text, $3::text) FROM closed) \
                 SELECT (SELECT n FROM seen), (SELECT next FROM seen), \
                   (SELECT count(*) FROM told), (SELECT count(*) FROM dead)"
            ),
            remove: format!(
                "WITH r AS (DELETE FROM {t} WHERE name = $1::text AND member = $2::text AND member <> '' RETURNING 1), \
                 told AS (SELECT pg_notify($3::text, $4::text) FROM r) \
                 SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM told)"
            ),
            renew: format!(
                "UPDATE {t} SET expires = clock_timestamp() + $3::int8 * interval '1 microsecond' \
                 WHERE {live} AND member = $2::text RETURNING 1"
            ),
            table: t,
        }
    }
}
