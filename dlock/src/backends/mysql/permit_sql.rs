//! The names and statements of semaphores (the design is in `permits.rs`).
//!
//! A semaphore `name` under prefix `p` has, with `h` the first 24 hex
//! digits of SHA-256 of `p:name`:
//!
//! - slots `p:#p<h>.0` … `p:#p<h>.<N-1>` (named locks: a permit is one),
//! - a door `p:#q<h>` (a named lock the head waiter holds),
//! - an admin lock `p:#m<h>` (held for the length of one statement, so
//!   that choosing a slot and checking or writing the count is one step),
//! - a count row `p:#n<h>` in `dlock_fences` (its `fence` column is the
//!   count; no holder, so `inspect` and `list` never show it).
//!
//! Lock names of keys are `p:<key>` with a key not starting with `#`, or
//! `p:#<hex digits>`: none of them has a `p`, `q`, `m` or `n` after the
//! `#`, so no semaphore name is a lock's name. Every name is at most
//! 30 + 2 + 1 + 24 + 1 + 3 = 61 characters (MySQL 8 takes 64).

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::cancel::QueueWait;
use super::names::hex_literal;
use super::sql::{Statements, Wait, NOW_US};

/// The most permits a semaphore may have on MySQL: the slots a statement
/// looks at are the numbers 0..999 ([`seq`]).
pub(super) const MAX_PERMITS: usize = 1000;

/// The names of one semaphore.
#[derive(Debug, Clone)]
pub(super) struct PermitNames {
    /// The slots' common beginning: slot `i` is `base` followed by `i`.
    pub(super) base: String,
    /// The head waiter's lock.
    pub(super) door: String,
    admin: String,
    /// The count row's name.
    pub(super) count: String,
    /// `<prefix>:<name>`, kept in the count row as its key.
    key: String,
}

impl PermitNames {
    pub(super) fn new(prefix: &str, name: &str) -> Self {
        let key = format!("{prefix}:{name}");
        let digest = Sha256::digest(key.as_bytes());
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        PermitNames {
            base: format!("{prefix}:#p{hex}."),
            door: format!("{prefix}:#q{hex}"),
            admin: format!("{prefix}:#m{hex}"),
            count: format!("{prefix}:#n{hex}"),
            key,
        }
    }

    /// The lock name of slot `i`.
    pub(super) fn slot(&self, i: usize) -> String {
        format!("{}{i}", self.base)
    }
}

/// The lock name of slot `slot` of the semaphore `name` under the default
/// prefix of `database` ([`default_prefix`](super::default_prefix)): what
/// `IS_USED_LOCK` takes to see who holds that permit.
///
/// ```
/// use dlock::backends::mysql::permit_slot_name;
/// let slot = permit_slot_name("app", "exports", 0);
/// assert!(slot.starts_with("dlock.app:#p") && slot.ends_with(".0"));
/// assert!(slot.chars().count() <= dlock::backends::mysql::MAX_NAME_CHARS);
/// ```
pub fn permit_slot_name(database: &str, name: &str, slot: usize) -> String {
    permit_slot_name_in(&super::names::default_prefix(database), name, slot)
}

/// The lock name of slot `slot` of the semaphore `name` under `prefix`
/// (see [`permit_slot_name`]).
///
/// ```
/// use dlock::backends::mysql::permit_slot_name_in;
/// assert!(permit_slot_name_in("jobs", "exports", 2).starts_with("jobs:#p"));
/// ```
pub fn permit_slot_name_in(prefix: &str, name: &str, slot: usize) -> String {
    PermitNames::new(prefix, name).slot(slot)
}

/// The numbers 0..999 as a derived table of one column `i` (three digits
/// crossed): the slots a statement may look at, with no recursive query
/// (which MySQL 5.7 lacks) and no table of dlock's.
fn seq() -> String {
    let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    format!(
        "(SELECT a.d + 10 * b.d + 100 * c.d AS i FROM {digits} a CROSS JOIN {digits} b CROSS JOIN {digits} c)"
    )
}

/// What one take statement does beside the take itself.
#[derive(Debug, Clone, Copy)]
pub(super) struct Take {
    /// The head waiter's watch, a request of its own before the take
    /// (`cancel.rs` says why): slot `.0`, and what its `GET_LOCK`
    /// answered (1: the slot is held, and is the permit). `None`: a plain
    /// try.
    pub(super) watch: Option<(usize, Option<i64>)>,
    /// The session holds the door: let it go with the grant.
    pub(super) door: bool,
}

impl Statements {
    /// Takes a permit of `names` with `permits` permits, in one round trip
    /// (see `permits.rs`). Answers one row: the admin lock's `GET_LOCK`
    /// answer, the stored count if it is another one with a permit out
    /// (else NULL), whether a permit was taken (1) and its slot.
    pub(super) fn take_permit(
        &self,
        names: &PermitNames,
        permits: usize,
        ttl_cap: Duration,
        admin_wait: Duration,
        take: Take,
    ) -> String {
        let base = hex_literal(names.base.as_bytes());
        let admin = hex_literal(names.admin.as_bytes());
        let count = hex_literal(names.count.as_bytes());
        let key = hex_literal(names.key.as_bytes());
        let table = &self.table;
        let seq = seq();
        let (watched, watch) = match take.watch {
            Some((k, got)) => (k.to_string(), got.map_or("NULL".into(), |g| g.to_string())),
            None => ("NULL".into(), "0".into()),
        };
        let door = if take.door {
            format!(
                "DO IF(@dlp_got = 1, RELEASE_LOCK({}), 0); ",
                hex_literal(names.door.as_bytes())
            )
        } else {
            String::new()
        };
        let keep_us = i64::try_from(ttl_cap.as_micros()).unwrap_or(i64::MAX / 2);
        format!(
            "SET @dlp_admin = NULL, @dlp_other = NULL, @dlp_slot = NULL, @dlp_got = 0; \
             SET @dlp_w = {watch}; \
             SET @dlp_admin = GET_LOCK({admin}, {admin_wait}); \
             SET @dlp_c = (SELECT fence FROM {table} WHERE name = {count}); \
             SET @dlp_other = IF(@dlp_admin = 1 AND @dlp_c <> {permits} AND EXISTS (SELECT 1 FROM {seq} s \
               WHERE s.i < @dlp_c AND IFNULL(IS_USED_LOCK(CONCAT({base}, s.i)), CONNECTION_ID()) <> CONNECTION_ID()), \
               @dlp_c, NULL); \
             SET @dlp_slot = CASE WHEN @dlp_admin IS NULL OR @dlp_admin <> 1 OR @dlp_other IS NOT NULL THEN NULL \
               WHEN @dlp_w = 1 THEN {watched} \
               ELSE (SELECT MIN(s.i) FROM {seq} s WHERE s.i < {permits} AND IS_USED_LOCK(CONCAT({base}, s.i)) IS NULL) END; \
             SET @dlp_got = CASE WHEN @dlp_slot IS NULL THEN 0 WHEN @dlp_w = 1 THEN 1 \
               ELSE IFNULL(GET_LOCK(CONCAT({base}, @dlp_slot), 0), 0) END; \
             DO IF(@dlp_w = 1 AND @dlp_got <> 1, RELEASE_LOCK(CONCAT({base}, {watched})), 0); \
             INSERT INTO {table} (name, lock_key, fence, holder, conn, ttl_ms, renewed_us) \
               SELECT {count}, {key}, {permits}, NULL, NULL, 0, {NOW_US} + {keep_us} FROM DUAL WHERE @dlp_got = 1 \
             ON DUPLICATE KEY UPDATE fence = VALUES(fence), lock_key = VALUES(lock_key), renewed_us = VALUES(renewed_us); \
             DO IF(@dlp_admin = 1, RELEASE_LOCK({admin}), 0); \
             {door}\
             SELECT @dlp_admin, @dlp_other, @dlp_got, @dlp_slot",
            admin_wait = Wait::For(admin_wait).seconds(),
        )
    }

    /// What a take statement cut short by a server error may hold: let go
    /// (harmless where nothing is held).
    pub(super) fn take_permit_undo(names: &PermitNames) -> String {
        let base = hex_literal(names.base.as_bytes());
        format!(
            "DO RELEASE_LOCK({admin}); \
             DO IF(@dlp_got = 1 AND @dlp_slot IS NOT NULL, RELEASE_LOCK(CONCAT({base}, @dlp_slot)), 0)",
            admin = hex_literal(names.admin.as_bytes()),
        )
    }

    /// Lets go what a waiting session may hold for a permit wait of `names`
    /// (`permits` slots): the admin lock, the door, and each slot it holds
    /// (the watched one, or one taken for a caller that left). Run only on
    /// a waiting session, which holds nothing else of the semaphore.
    pub(super) fn permit_let_go(names: &PermitNames, permits: usize) -> String {
        let base = hex_literal(names.base.as_bytes());
        format!(
            "DO RELEASE_LOCK({admin}); DO RELEASE_LOCK({door}); \
             SELECT COUNT(RELEASE_LOCK(CONCAT({base}, s.i))) FROM {seq} s \
             WHERE s.i < {permits} AND IS_USED_LOCK(CONCAT({base}, s.i)) <=> CONNECTION_ID()",
            admin = hex_literal(names.admin.as_bytes()),
            door = hex_literal(names.door.as_bytes()),
            seq = seq(),
        )
    }

    /// Queues for the door of a semaphore: `GET_LOCK(door, wait)`.
    pub(super) fn permit_door(names: &PermitNames, wait: Wait) -> QueueWait {
        QueueWait::get_lock(&hex_literal(names.door.as_bytes()), wait)
    }

    /// The head waiter's watch of slot `k`: `GET_LOCK(slot k, wait)`.
    pub(super) fn permit_watch(names: &PermitNames, k: usize, wait: Wait) -> QueueWait {
        let base = hex_literal(names.base.as_bytes());
        QueueWait::get_lock(&format!("CONCAT({base}, {k})"), wait)
    }

    /// The renewal of permits held through one session, by slot name and
    /// count row: the count rows kept (for another `ttl_cap`: they must
    /// outlive every permit out, whatever `?fence_retention=` says), then
    /// one column per slot: whether the session still holds it.
    pub(super) fn renew_permits(
        &self,
        slots: &[&str],
        counts: &[&str],
        ttl_cap: Duration,
    ) -> String {
        let keep_us = i64::try_from(ttl_cap.as_micros()).unwrap_or(i64::MAX / 2);
        let counts: Vec<String> = counts.iter().map(|c| hex_literal(c.as_bytes())).collect();
        let checks: Vec<String> = slots
            .iter()
            .map(|s| {
                format!(
                    "IS_USED_LOCK({}) <=> CONNECTION_ID()",
                    hex_literal(s.as_bytes())
                )
            })
            .collect();
        format!(
            "UPDATE {table} SET renewed_us = {NOW_US} + {keep_us} WHERE name IN ({counts}); SELECT {checks}",
            table = self.table,
            counts = counts.join(", "),
            checks = checks.join(", "),
        )
    }

    /// What `available` reads of `names` with `permits` permits, taking
    /// nothing: the stored count (NULL if none), how many slots below
    /// `permits` any session holds, and how many below the stored count.
    pub(super) fn permits_available(&self, names: &PermitNames, permits: usize) -> String {
        let base = hex_literal(names.base.as_bytes());
        let count = hex_literal(names.count.as_bytes());
        let seq = seq();
        format!(
            "SET @dlp_c = (SELECT fence FROM {table} WHERE name = {count}); \
             SELECT @dlp_c, \
               (SELECT COUNT(*) FROM {seq} s WHERE s.i < {permits} AND IS_USED_LOCK(CONCAT({base}, s.i)) IS NOT NULL), \
               (SELECT COUNT(*) FROM {seq} s WHERE s.i < IFNULL(@dlp_c, 0) AND IS_USED_LOCK(CONCAT({base}, s.i)) IS NOT NULL)",
            table = self.table,
        )
    }

    /// What `inspect_semaphore` reads of `names`, taking nothing: one row
    /// per connection holding slots below the stored count (the count,
    /// the connection id, how many slots).
    pub(super) fn permits_inspect(&self, names: &PermitNames) -> String {
        let base = hex_literal(names.base.as_bytes());
        let count = hex_literal(names.count.as_bytes());
        let seq = seq();
        format!(
            "SET @dlp_c = (SELECT fence FROM {table} WHERE name = {count}); \
             SELECT @dlp_c, IS_USED_LOCK(CONCAT({base}, s.i)) AS conn, COUNT(*) FROM {seq} s \
               WHERE s.i < IFNULL(@dlp_c, 0) AND IS_USED_LOCK(CONCAT({base}, s.i)) IS NOT NULL \
               GROUP BY conn",
            table = self.table,
        )
    }

    /// The keys (`<prefix>:<name>`) of the count rows whose key starts
    /// with `start`: the semaphores `semaphore_names` lists (at most
    /// `limit`; a row outlives its permits until the sweep).
    pub(super) fn semaphore_keys(&self, prefix: &str, start: &str, limit: usize) -> String {
        let rows = format!("{prefix}:#n");
        format!(
            "SELECT lock_key FROM {table} WHERE LEFT(name, {rows_len}) = {rows} \
               AND LEFT(lock_key, {len}) = {start} ORDER BY lock_key LIMIT {limit}",
            table = self.table,
            rows_len = rows.len(),
            rows = hex_literal(rows.as_bytes()),
            len = start.len(),
            start = hex_literal(start.as_bytes()),
        )
    }

    /// Lets a permit's slot go: `RELEASE_LOCK`'s answer (1: it was ours).
    pub(super) fn release_permit(slot: &str) -> String {
        format!("SELECT RELEASE_LOCK({})", hex_literal(slot.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semaphore_names_are_no_lock_names_and_fit_mysql_8() {
        let prefix = "p".repeat(30);
        let names = PermitNames::new(&prefix, &"x".repeat(300));
        for name in [
            names.slot(MAX_PERMITS - 1),
            names.door.clone(),
            names.admin.clone(),
            names.count.clone(),
        ] {
            assert!(
                name.chars().count() <= super::super::MAX_NAME_CHARS,
                "{name}"
            );
            let after = &name[prefix.len() + 1..];
            assert!(after.starts_with('#'), "{name}");
            assert!(
                !after[1..2].chars().all(|c| c.is_ascii_hexdigit()),
                "{name}"
            );
        }
        assert_ne!(
            PermitNames::new("p", "a").base,
            PermitNames::new("p", "b").base
        );
    }
}
