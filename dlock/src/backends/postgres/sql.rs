//! Every SQL statement the backend sends, built once per backend with the
//! fence table's schema quoted in.
//!
//! Each statement runs on a session whose `search_path` is pinned to
//! `pg_catalog, pg_temp` (`trust::PIN_SEARCH_PATH`), so every unqualified
//! function, operator and type below is the system's; dlock's tables are
//! always written with their schema.
//!
//! A fence is `GREATEST(last + 1, the server's clock in µs)` ([`NOW_US`]):
//! a key's counter row can then be forgotten once idle past
//! `?fence_retention=` (see `retention.rs`), and the next fence still
//! exceeds every earlier one.
//!
//! A bigint advisory lock shows in `pg_locks` as `classid` = its high 32 bits
//! and `objid` = its low 32 bits (both unsigned), `objsubid` = 1, in the
//! database of the session that took it: [`HELD_BY`] matches that.

use super::pooler::guard;

/// The one channel releases are announced on; the payload is the advisory
/// key in decimal.
pub(super) const CHANNEL: &str = "dlock_released";

/// The channel of elections' announcements; the payload is the election's
/// advisory key in decimal, a newline, and the announcement
/// (`backends::announcements`).
pub(super) const ELECTED: &str = "dlock_elected";

/// The server's clock in µs since the epoch, an `int8`: the floor of every
/// fence.
pub(super) const NOW_US: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::int8";

/// `pg_locks` rows of the advisory lock `$id` (an expression naming a
/// bigint) in this database, granted.
macro_rules! held_by {
    ($id:literal, $pid:literal) => {
        held_by!($id, $pid, "1")
    };
    ($id:literal, $pid:literal, $subid:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted",
            " AND l.objsubid = ",
            $subid,
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            " AND l.classid = ((",
            $id,
            " >> 32) & 4294967295)::oid AND l.objid = (",
            $id,
            " & 4294967295)::oid",
            $pid,
            ")"
        )
    };
}

/// Whether this session holds the advisory lock `$id` (an expression
/// naming a bigint) of form `$subid` (1: `bigint`, 2: two `int4`s) in
/// `$mode`: its own `pg_locks` rows. The server warns (`you don't own a
/// lock of type …`, a log line) for every unlock of a lock the session does
/// not hold, so every unlock that may find nothing (the undoing of a
/// dropped or refused attempt) asks first. No `pg_database` look-up (a
/// session's advisory locks are all in its own database): that shared
/// catalog would take a lock-table entry, which a full table refuses.
macro_rules! own_lock {
    ($id:literal, $subid:literal, $mode:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory'",
            " AND l.granted AND l.objsubid = ",
            $subid,
            " AND l.mode = '",
            $mode,
            "' AND l.classid = ((",
            $id,
            " >> 32) & 4294967295)::oid AND l.objid = (",
            $id,
            " & 4294967295)::oid)"
        )
    };
}

/// The statements, with the tables' names filled in. Each one that takes,
/// checks or lets go an advisory lock has one parameter more than its doc
/// below says, the last: the session's claim token, which its pooler guard
/// compares (`pooler.rs`).
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
    /// [`acquire`](Self::acquire) after a wait in the server's own queue
    /// of the lock ([`wait_block`]; see `turns.rs`): the lock is not taken
    /// again but found among this session's own, and, if there, the fence
    /// and holder row written. Same parameters.
    pub(super) claim: String,
    /// Cancels the statement of the server process `$1` (`int4`) if it
    /// waits for an advisory lock (a dropped wait's [`wait_block`], which
    /// ends quietly when cancelled); answers how many it cancelled (0 or 1).
    /// Anything else that process runs is left alone.
    pub(super) cancel: String,
    /// Moves the expiry of the holder rows `$1` (names) that still name
    /// their token (`$2`, ttls `$3`); answers the names of those rows.
    /// Whether the session still holds each lock is [`own_locks`](Self::own_locks)'
    /// answer, read once per session per renewal round.
    pub(super) renew: String,
    /// The advisory locks (`bigint` form) this session holds: `pg_locks`
    /// filtered by its own pid, set-based. The view is built from the
    /// whole server's lock table at each read, so a renewal round reads it
    /// once per session, whatever the number of its statements. No
    /// `pg_database` look-up (a session's advisory locks are all in its
    /// own database): that shared catalog would take a lock-table entry,
    /// which a full table refuses.
    pub(super) own_locks: String,
    /// Unlock `$1` and announce, then clear the holder row of `$2` if it
    /// names `$3`; answers whether the lock was held and whether the row
    /// named `$3` before the unlock (read first, so a next holder's row
    /// written in between does not make the answer false). The unlock
    /// comes first because it needs no room in the server's lock table
    /// and frees some: the row's clear (a write, which locks its
    /// transaction id) and the announcement then find room in a full one.
    pub(super) release: String,
    /// Unlock `$1` and announce, whatever the row says, if this session
    /// holds it (answers false, and the server logs nothing, if not).
    pub(super) unlock: String,
    /// `$1` name: fence, holder token, seconds left, whether held by anyone.
    pub(super) inspect: String,
    /// Clears the holder row of `$1` (name) if its key is held: the holder's
    /// next renewal is refused.
    pub(super) force_release: String,
    /// The held rows whose name starts with `$1`, by name, at most `$2`.
    pub(super) list: String,
    /// The read-write lock statements.
    pub(super) rw: RwStatements,
    /// Deletes a bounded batch of the rows idle past `?fence_retention=`.
    pub(super) sweep: String,
    /// The semaphore statements.
    pub(super) permits: PermitStatements,
    /// `"schema".dlock_leaders`: each election's leader record, created on
    /// the first use of an election (unlogged: a record means something
    /// only while its session holds the election's lock).
    pub(super) leaders: String,
    /// The election statements.
    pub(super) elections: ElectionStatements,
    /// The count-down latch statements.
    pub(super) latches: LatchStatements,
    /// The double barrier statements (`barrier.rs`).
    pub(super) barriers: super::barrier_sql::BarrierStatements,
}

/// The statements of count-down latches: the row `$1` (`<prefix>:<name>`)
/// of `"schema".dlock_latches` holds a live count (at least 1); no row is
/// a count of zero.
#[derive(Debug, Clone)]
pub(super) struct LatchStatements {
    /// `"schema".dlock_latches`.
    pub(super) table: String,
    /// Creates the latches' table if it is missing.
    pub(super) create: String,
    /// Sets the count of `$1` to `$2` where no count is live; answers a
    /// row if it did.
    pub(super) set: String,
    /// Takes one from the count of `$1`, deleting the row at one and then
    /// announcing `$3` (the waiters' key) on the channel `$2`; nothing
    /// without a row. The row is locked first (`FOR UPDATE`, which reads
    /// its newest version), so each of many concurrent count-downs takes
    /// one from the count the one before it left.
    pub(super) count_down: String,
    /// The count of `$1`, 0 without a row.
    pub(super) read: String,
}

impl LatchStatements {
    fn new(schema: &str) -> Self {
        let table = format!("\"{schema}\".dlock_latches");
        LatchStatements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (name text PRIMARY KEY, remaining bigint NOT NULL)"
            ),
            set: format!(
                "INSERT INTO {table} AS t (name, remaining) VALUES ($1::text, $2::int8) \
                 ON CONFLICT (name) DO UPDATE SET remaining = EXCLUDED.remaining WHERE t.remaining <= 0 \
                 RETURNING 1"
            ),
            count_down: format!(
                "WITH cur AS (SELECT remaining FROM {table} WHERE name = $1::text FOR UPDATE), \
                 gone AS (DELETE FROM {table} WHERE name = $1::text AND (SELECT remaining FROM cur) <= 1 RETURNING 1), \
                 less AS (UPDATE {table} SET remaining = remaining - 1 \
                   WHERE name = $1::text AND (SELECT remaining FROM cur) > 1 RETURNING 1), \
                 n AS (SELECT pg_notify($2::text, $3::text) FROM gone) \
                 SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM less), (SELECT count(*) FROM n)"
            ),
            read: format!(
                "SELECT COALESCE((SELECT remaining FROM {table} WHERE name = $1::text), 0)::int8"
            ),
            table,
        }
    }
}

/// The statements of elections. An election `<prefix>:<name>` is the plain
/// lock of that name; its record names the lease's token, the session
/// (`pid`) that held the lock when it was written, the term (the lease's
/// fence) and the value. A record counts only while that session still
/// holds the lock and the holder row still names the token.
#[derive(Debug, Clone)]
pub(super) struct ElectionStatements {
    /// Writes the record `$2` (name), `$3` token, `$4` term, `$5` value if
    /// this session holds the lock `$1` and the holder row names the token,
    /// and announces it on [`ELECTED`]. Answers how many records were
    /// written (0 or 1).
    pub(super) proclaim: String,
    /// Deletes the record of `$2` if it names the token `$3`, and announces
    /// the end of its term on [`ELECTED`] (the election's key is `$1`).
    pub(super) withdraw: String,
    /// The live record of `$1`: (term, value), or no row.
    pub(super) leader: String,
    /// Creates the leaders' table if it is missing.
    pub(super) create: String,
}

/// The statements of semaphores. A semaphore `$1` (its base, an `int8`)
/// of `$3` permits has the slots `$1 + 0 .. $1 + $3 - 1` (`bigint`
/// advisory locks, one per permit) and a count marker, the two-`int4` lock
/// (`$2`, `$3`) that every permit holder holds shared: another count's
/// marker in `pg_locks` means the caller's count is not the stored one.
#[derive(Debug, Clone)]
pub(super) struct PermitStatements {
    /// Takes the semaphore's gate `$6` (a `bigint` advisory lock, reentrant:
    /// the waiter in line holds it already), the marker shared, then (if no
    /// other count's marker is held) the first `$5` free slots, all of them
    /// or none: fewer are let go again, and so is the marker; the gate is
    /// let go once at the end. Only a gate holder takes slots, so no other
    /// taker ever sees a partial hold. Answers (the first slot's index or
    /// null, another count or null).
    pub(super) take: String,
    /// Whether this session holds the gate `$1` (after its wait in line).
    pub(super) gate_held: String,
    /// How many slots of the semaphore `$1` of `$3` permits are held, by
    /// anyone, and another count's marker or null (`$2` the marker's first
    /// half).
    pub(super) taken: String,
    /// Lets go every slot of the semaphore this session holds, and its
    /// marker, and announces `$1`. Answers how many slots were let go.
    pub(super) free: String,
    /// Which of the slots `$1` this session holds.
    pub(super) renew: String,
    /// The count the markers of `$2` say (the largest, if two counts
    /// overlap), and each session holding slots `$1 ..` below it, with
    /// how many: what `inspect_semaphore` reads, taking nothing.
    pub(super) inspect: String,
}

/// The statements of read-write locks. Their advisory locks are of the
/// two-`int4` form (`pg_advisory_lock(int4, int4)`, `objsubid` = 2 in
/// `pg_locks`), a namespace PostgreSQL keeps apart from the `bigint` form
/// of plain locks; each key is passed as one `int8` and split here into
/// its signed high and low halves.
#[derive(Debug, Clone)]
pub(super) struct RwStatements {
    /// A read: the writer-intent key `$2` taken shared and let go at once
    /// (refused while a writer waits or holds it), then the lock `$1`
    /// taken shared. Answers whether the read was granted.
    pub(super) read: String,
    /// The current fence of the read-write lock named `$1` (0 if none):
    /// sent behind a granted read, so it sees every write before it.
    pub(super) fence: String,
    /// A write: the writer-intent key `$2` (unless `$4`: already held),
    /// then the lock `$1` exclusive and, if granted, the next fence of
    /// `$3`; the intent is let go when the lock is granted, or when it is
    /// not and `$5` (keep it while waiting) is false. Answers
    /// (intent held, granted, fence).
    pub(super) write: String,
    /// Unlocks the exclusive key `$1` and announces `$2`, if this session
    /// holds it exclusively (else answers false, and nothing is logged).
    pub(super) unlock: String,
    /// Unlocks the shared lock `$1` and announces it, if this session
    /// holds it shared (else answers false).
    pub(super) unlock_shared: String,
    /// Which of the locks `$1` this session holds (either mode).
    pub(super) renew: String,
}

/// The signed high and low `int4` halves of the `int8` parameter `$n`.
macro_rules! pair {
    ($n:literal) => {
        concat!(
            "(($",
            $n,
            "::int8) >> 32)::int4, ((($",
            $n,
            "::int8) << 32) >> 32)::int4"
        )
    };
}

impl Statements {
    /// The statements for the tables of `schema`, fence rows kept
    /// `retention` after their last fence.
    pub(super) fn new(schema: &str, retention: std::time::Duration) -> Self {
        let retention_us = i64::try_from(retention.as_micros()).unwrap_or(i64::MAX);
        let table = format!("\"{schema}\".dlock_fences");
        let holders = format!("\"{schema}\".dlock_holders");
        let leaders = format!("\"{schema}\".dlock_leaders");
        let held_by_anyone = held_by!("h.lock_id", "");
        let (g1, g2, g4, g5) = (guard(1), guard(2), guard(4), guard(5));
        let mine = own_lock!("$1::int8", "1", "ExclusiveLock");
        let acquire = format!(
                "WITH got AS (SELECT pg_try_advisory_lock($1::int8) AS ok WHERE {g5}), \
                 fence AS (INSERT INTO {table} AS f (name, counter) SELECT $2::text, {NOW_US} FROM got WHERE ok \
                   ON CONFLICT (name) DO UPDATE SET counter = GREATEST(f.counter + 1, EXCLUDED.counter) RETURNING counter), \
                 who AS (INSERT INTO {holders} AS h (name, lock_id, fence, holder, expires) \
                   SELECT $2::text, $1::int8, fence.counter, $3::text, clock_timestamp() + make_interval(secs => $4::float8) FROM fence \
                   ON CONFLICT (name) DO UPDATE SET lock_id = EXCLUDED.lock_id, fence = EXCLUDED.fence, \
                   holder = EXCLUDED.holder, expires = EXCLUDED.expires RETURNING 1) \
                 SELECT (SELECT ok FROM got), (SELECT counter FROM fence), (SELECT count(*) FROM who)"
        );
        Statements {
            claim: claim(&acquire),
            cancel: "SELECT count(pg_cancel_backend(a.pid)) FROM pg_stat_get_activity($1::int4) a \
                     WHERE a.wait_event_type = 'Lock' AND a.wait_event = 'advisory'"
                .to_owned(),
            acquire,
            renew: format!(
                "UPDATE {holders} h SET expires = clock_timestamp() + make_interval(secs => k.secs) \
                 FROM unnest($1::text[], $2::text[], $3::float8[]) AS k(name, token, secs) \
                 WHERE h.name = k.name AND h.holder = k.token RETURNING h.name"
            ),
            own_locks: format!(
                "SELECT ((l.classid::int8 << 32) | l.objid::int8) FROM pg_locks l \
                 WHERE {g1} AND l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
            ),
            release: format!(
                "WITH mine AS (SELECT count(*) AS n FROM {holders} WHERE name = $2::text AND holder = $3::text), \
                 u AS (SELECT pg_advisory_unlock($1::int8) AS ok, mine.n FROM mine WHERE {g4}), \
                 c AS (UPDATE {holders} SET holder = NULL, expires = NULL \
                   WHERE name = $2::text AND holder = $3::text AND (SELECT ok FROM u) IS NOT NULL RETURNING 1), \
                 n AS (SELECT pg_notify('{CHANNEL}', $1::int8::text) FROM u WHERE ok) \
                 SELECT (SELECT ok FROM u), (SELECT n FROM u), (SELECT count(*) FROM n), (SELECT count(*) FROM c)"
            ),
            unlock: format!(
                "WITH u AS (SELECT CASE WHEN {mine} THEN pg_advisory_unlock($1::int8) ELSE false END AS ok \
                   WHERE {g2}), \
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
            rw: RwStatements::new(&table, retention_us),
            sweep: sweep(&table, &holders, retention_us, held_by_anyone),
            permits: PermitStatements::new(),
            elections: ElectionStatements::new(&holders, &leaders),
            latches: LatchStatements::new(schema),
            barriers: super::barrier_sql::BarrierStatements::new(schema),
            table,
            holders,
            leaders,
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

impl ElectionStatements {
    fn new(holders: &str, leaders: &str) -> Self {
        let held_by_me = held_by!("$1::int8", " AND l.pid = pg_backend_pid()");
        let held_by_writer = held_by!("h.lock_id", " AND l.pid = r.pid");
        let g6 = guard(6);
        ElectionStatements {
            proclaim: format!(
                "WITH ok AS (SELECT 1 WHERE {g6} AND {held_by_me} \
                   AND EXISTS (SELECT 1 FROM {holders} h WHERE h.name = $2::text AND h.holder = $3::text)), \
                 w AS (INSERT INTO {leaders} AS r (name, holder, pid, term, value) \
                   SELECT $2::text, $3::text, pg_backend_pid(), $4::int8, $5::text FROM ok \
                   ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, pid = EXCLUDED.pid, \
                   term = EXCLUDED.term, value = EXCLUDED.value WHERE r.term <= EXCLUDED.term RETURNING 1), \
                 n AS (SELECT pg_notify('{ELECTED}', $1::int8::text || E'\\n' || $4::int8::text || E'\\n' || $5::text) FROM w) \
                 SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM n)"
            ),
            withdraw: format!(
                "WITH d AS (DELETE FROM {leaders} WHERE name = $2::text AND holder = $3::text RETURNING term), \
                 n AS (SELECT pg_notify('{ELECTED}', $1::int8::text || E'\\n-' || d.term::text) FROM d) \
                 SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM n)"
            ),
            leader: format!(
                "SELECT r.term, r.value FROM {leaders} r \
                 JOIN {holders} h ON h.name = r.name AND h.holder = r.holder \
                 WHERE r.name = $1::text AND {held_by_writer}"
            ),
            create: format!(
                "CREATE UNLOGGED TABLE IF NOT EXISTS {leaders} (name text PRIMARY KEY, holder text NOT NULL, \
                 pid int4 NOT NULL, term bigint NOT NULL, value text NOT NULL)"
            ),
        }
    }
}

impl RwStatements {
    fn new(table: &str, retention_us: i64) -> Self {
        let held_by_me = held_by!("a.id", " AND l.pid = pg_backend_pid()", "2");
        let (main, intent) = (pair!("1"), pair!("2"));
        let (g2, g3, g6) = (guard(2), guard(3), guard(6));
        let mine = own_lock!("$1::int8", "2", "ExclusiveLock");
        let shared = own_lock!("$1::int8", "2", "ShareLock");
        RwStatements {
            read: format!(
                "WITH i AS (SELECT pg_try_advisory_lock_shared({intent}) AS ok WHERE {g3}), \
                 m AS (SELECT CASE WHEN i.ok THEN pg_try_advisory_lock_shared({main}) ELSE false END AS ok FROM i), \
                 u AS (SELECT pg_advisory_unlock_shared({intent}) FROM i, m WHERE i.ok) \
                 SELECT (SELECT ok FROM m), (SELECT count(*) FROM u)"
            ),
            // No row: the last write is older than the retention (or there
            // was none), so its fence was below `now - retention`, and the
            // next write's will be above it.
            fence: format!(
                "SELECT COALESCE((SELECT counter FROM {table} WHERE name = $1::text), \
                 GREATEST(0, {NOW_US} - {retention_us}))::int8"
            ),
            write: format!(
                "WITH i AS (SELECT CASE WHEN $4::bool THEN true ELSE pg_try_advisory_lock({intent}) END AS ok WHERE {g6}), \
                 m AS (SELECT CASE WHEN i.ok THEN pg_try_advisory_lock({main}) ELSE false END AS ok FROM i), \
                 fence AS (INSERT INTO {table} AS f (name, counter) SELECT $3::text, {NOW_US} FROM m WHERE m.ok \
                   ON CONFLICT (name) DO UPDATE SET counter = GREATEST(f.counter + 1, EXCLUDED.counter) RETURNING counter), \
                 u AS (SELECT pg_advisory_unlock({intent}) AS ok FROM i, m, (SELECT count(*) FROM fence) x \
                   WHERE i.ok AND (m.ok OR NOT $5::bool)), \
                 n AS (SELECT pg_notify('{CHANNEL}', $1::int8::text) FROM u WHERE u.ok) \
                 SELECT (SELECT ok FROM i), (SELECT ok FROM m), (SELECT counter FROM fence), (SELECT count(*) FROM n)"
            ),
            unlock: format!(
                "WITH u AS (SELECT CASE WHEN {mine} THEN pg_advisory_unlock({main}) ELSE false END AS ok \
                   WHERE {g3}), \
                 n AS (SELECT pg_notify('{CHANNEL}', $2::int8::text) FROM u WHERE ok) \
                 SELECT (SELECT ok FROM u), (SELECT count(*) FROM n)"
            ),
            unlock_shared: format!(
                "WITH u AS (SELECT CASE WHEN {shared} THEN pg_advisory_unlock_shared({main}) ELSE false END AS ok \
                   WHERE {g2}), \
                 n AS (SELECT pg_notify('{CHANNEL}', $1::int8::text) FROM u WHERE ok) \
                 SELECT (SELECT ok FROM u), (SELECT count(*) FROM n)"
            ),
            renew: format!(
                "SELECT a.id FROM unnest($1::int8[]) AS a(id) WHERE {g2} AND {held_by_me}"
            ),
        }
    }
}

/// This database's oid, for `pg_locks`.
const THIS_DATABASE: &str = "(SELECT oid FROM pg_database WHERE datname = current_database())";

impl PermitStatements {
    fn new() -> Self {
        let held_by_me = held_by!("a.id", " AND l.pid = pg_backend_pid()");
        let (g2, g4) = (guard(2), guard(4));
        let gate_mine = own_lock!("$1::int8", "1", "ExclusiveLock");
        let marker_rows = format!(
            "l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.database = {THIS_DATABASE} \
             AND l.classid = ($2::int8 & 4294967295)::oid"
        );
        PermitStatements {
            take: format!(
                "WITH gate AS MATERIALIZED (SELECT pg_try_advisory_lock($6::int8) AS ok WHERE {g4}), \
                 mark AS MATERIALIZED (SELECT pg_try_advisory_lock_shared($2::int4, $3::int4) AS ok FROM gate WHERE gate.ok), \
                 other AS MATERIALIZED (SELECT min(l.objid::int8) AS n FROM pg_locks l, mark \
                   WHERE mark.ok AND {marker_rows} AND l.objid <> ($3::int8 & 4294967295)::oid), \
                 slot AS MATERIALIZED (SELECT s.i FROM mark, other, generate_series(0, $3::int4 - 1) AS s(i) \
                   WHERE mark.ok AND other.n IS NULL AND pg_try_advisory_lock($1::int8 + s.i) LIMIT $5::int4), \
                 whole AS MATERIALIZED (SELECT count(*) = $5::int4 AS ok FROM slot), \
                 undo AS MATERIALIZED (SELECT pg_advisory_unlock($1::int8 + slot.i) FROM slot, whole WHERE NOT whole.ok), \
                 unmark AS MATERIALIZED (SELECT pg_advisory_unlock_shared($2::int4, $3::int4) \
                   FROM mark, whole, (SELECT count(*) FROM undo) x WHERE mark.ok AND NOT whole.ok), \
                 ungate AS MATERIALIZED (SELECT pg_advisory_unlock($6::int8) \
                   FROM gate, (SELECT count(*) FROM unmark) x WHERE gate.ok) \
                 SELECT (SELECT min(slot.i) FROM slot, whole WHERE whole.ok), (SELECT n FROM other), \
                   (SELECT count(*) FROM ungate)"
            ),
            gate_held: format!(
                "SELECT {gate_mine} AND {g2}"
            ),
            taken: format!(
                "SELECT (SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted \
                   AND l.objsubid = 1 AND l.database = {THIS_DATABASE} \
                   AND ((l.classid::int8 << 32) | l.objid::int8) BETWEEN $1::int8 AND $1::int8 + $3::int4 - 1), \
                 (SELECT min(l.objid::int8) FROM pg_locks l WHERE {marker_rows} AND l.objid <> ($3::int8 & 4294967295)::oid)"
            ),
            free: format!(
                "WITH mine AS (SELECT ((l.classid::int8 << 32) | l.objid::int8) AS id FROM pg_locks l \
                   WHERE {g4} AND l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted \
                   AND l.objsubid = 1 AND l.database = {THIS_DATABASE}), \
                 slots AS (SELECT pg_advisory_unlock(m.id) AS ok FROM mine m WHERE m.id BETWEEN $1::int8 AND $1::int8 + $3::int4 - 1), \
                 mark AS (SELECT pg_advisory_unlock_shared($2::int4, $3::int4) FROM (SELECT count(*) FROM slots) x \
                   WHERE EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = pg_backend_pid() AND {marker_rows} \
                   AND l.objid = ($3::int8 & 4294967295)::oid)), \
                 n AS (SELECT pg_notify('{CHANNEL}', $1::int8::text) FROM (SELECT count(*) FROM mark) x) \
                 SELECT (SELECT count(*) FROM slots WHERE ok), (SELECT count(*) FROM n)"
            ),
            renew: format!("SELECT a.id FROM unnest($1::int8[]) AS a(id) WHERE {g2} AND {held_by_me}"),
            inspect: format!(
                "WITH c AS (SELECT max(l.objid::int8) AS n FROM pg_locks l WHERE {marker_rows}) \
                 SELECT c.n, l.pid, count(*) FROM c, pg_locks l WHERE c.n IS NOT NULL \
                   AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                   AND l.database = {THIS_DATABASE} \
                   AND ((l.classid::int8 << 32) | l.objid::int8) BETWEEN $1::int8 AND $1::int8 + c.n - 1 \
                 GROUP BY c.n, l.pid"
            ),
        }
    }
}

/// The most rows of each table one sweep deletes.
pub(super) const SWEEP_BATCH: u32 = 1_000;

/// The sweep statement: deletes up to [`SWEEP_BATCH`] counter rows of `table`
/// and holder rows of `holders` idle past `retention_us`; `held` is the
/// condition "someone holds `h.lock_id`". Rows are picked by `ctid`, so a
/// row an acquisition rewrote meanwhile (a new version) is left alone.
fn sweep(table: &str, holders: &str, retention_us: i64, held: &str) -> String {
    format!(
        "WITH f AS (DELETE FROM {table} WHERE ctid = ANY (ARRAY(SELECT c.ctid FROM {table} c \
           WHERE c.counter < {NOW_US} - {retention_us} LIMIT {SWEEP_BATCH})) RETURNING 1), \
         g AS (DELETE FROM {holders} WHERE ctid = ANY (ARRAY(SELECT h.ctid FROM {holders} h \
           WHERE h.fence < {NOW_US} - {retention_us} AND NOT {held} LIMIT {SWEEP_BATCH})) RETURNING 1) \
         SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM g)"
    )
}

/// The head of the try statement [`claim`] rewrites (its guard is `$5`).
fn try_head() -> String {
    format!(
        "WITH got AS (SELECT pg_try_advisory_lock($1::int8) AS ok WHERE {})",
        guard(5)
    )
}

/// The claiming form of the acquisition statement `acquire` (which tries
/// with `pg_try_advisory_lock`), sent after a [`wait_block`]: whether the
/// block was granted the lock is whether this session holds it now (the
/// waiting session holds nothing else), and the lock is not asked for
/// again (advisory locks count per session: a second grant would need a
/// second unlock). The same fence and holder row follow; their writes may
/// wait for the previous holder's release to commit, under the session's
/// `lock_timeout` of 0.
fn claim(acquire: &str) -> String {
    let rest = acquire.strip_prefix(&try_head()).unwrap_or_else(|| {
        unreachable!("the acquisition statement starts with its try: {acquire}")
    });
    let mine = own_lock!("$1::int8", "1", "ExclusiveLock");
    format!("WITH got AS (SELECT {mine} AS ok WHERE {}){rest}", guard(5))
}

/// The wait of advisory key `key` in the server's own queue of the lock,
/// on the session whose claim token is `token`: a `DO` block whose
/// `pg_advisory_lock` waits at most `limit_ms` (`lock_timeout`, local to
/// the block's transaction; 0: no limit), and which ends without an error
/// whether the lock was granted, the time ran out, or a dropped wait
/// cancelled it (`pg_cancel_backend`, [`Statements::cancel`]): an error
/// caught in PL/pgSQL is not logged, so a timed-out or cancelled wait
/// writes nothing to the server's log, and the session stays usable.
/// Whether it was granted is [`claim`]'s answer, sent next. A `DO` block
/// takes no parameters: the key and limit are numbers, and the token
/// (`<hex>.<pid>.<µs>`, made by `pooler.rs`) is put in as a literal, or
/// `None` if it is not of that form.
pub(super) fn wait_block(key: i64, limit_ms: u128, token: &str) -> Option<String> {
    if token.is_empty()
        || !token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.')
    {
        return None;
    }
    let guarded = super::pooler::guard_on(&format!("'{token}'"));
    Some(format!(
        "DO $dlock$ BEGIN \
           IF {guarded} THEN \
             PERFORM set_config('lock_timeout', '{limit_ms}', true); \
             PERFORM pg_advisory_lock('{key}'::int8); \
           END IF; \
         EXCEPTION WHEN query_canceled OR lock_not_available THEN NULL; \
         END $dlock$"
    ))
}
