//! Refusing a transaction or statement pooler (PgBouncer's
//! `pool_mode = transaction` or `statement`, Supavisor's transaction port,
//! pgpool-II without session pinning) between dlock and PostgreSQL.
//!
//! dlock's locks are session advisory locks. A transaction pooler runs
//! each transaction of a client on whichever server session is free, so a
//! lock taken by one client stays on a server session that the pooler then
//! lends to another client, whose `pg_try_advisory_lock` of the same key
//! succeeds there (advisory locks are reentrant per session): two holders.
//! Nothing in the protocol says a pooler is there, so each new session is
//! tested before it takes any lock, with simple-protocol statements only
//! (a named prepared statement does not survive such a pooler):
//!
//! - **The claim**: the session's first statement writes a random id into
//!   the custom setting `dlock.session` of the server session it runs on,
//!   unless that server session already carries one or already holds
//!   advisory locks: then another client's dlock session is (or was) on
//!   it, which only a pooler arranges. PostgreSQL starts every session
//!   with the setting empty, and PgBouncer's session mode resets a server
//!   session with `DISCARD ALL` (which empties it and frees its advisory
//!   locks) before lending it to the next client, so session pooling and
//!   direct connections pass.
//! - **The probe**: a second, short connection reads `dlock.session` and
//!   `pg_backend_pid()`: on a direct connection or through a session
//!   pooler it is a server session of its own (empty, another pid); a
//!   transaction pooler hands it an idle server session, PgBouncer the
//!   most recently used one: the claimed one.
//! - **The guard**, on every statement after that which takes, checks or
//!   lets go an advisory lock (try, wait, release, unlock, the renewal's
//!   own-locks read; read-write, semaphore and election statements): its
//!   last parameter is the session's claim token
//!   (`<id>.<pid>.<backend start in µs>`, written by the claim) and
//!   [`guard`] in the `WHERE` of the query that calls the lock function
//!   lets it act only where `current_setting('dlock.session', true)`
//!   equals it. The probe alone is not enough: with a bigger pool, other
//!   traffic or `server_round_robin = 1` it lands on another idle server
//!   session and passes, and tokio-postgres names prepared statements
//!   `s0`, `s1`, … in the same order in every process, so a statement can
//!   find "its" prepared statement on a server session another process
//!   prepared it on. Anywhere but the claimed server session the guard
//!   ends that claimed server session (`pg_terminate_backend` of the pid
//!   whose backend start matches the token, so the locks it holds are
//!   freed: the pooler would keep it open) and fails the statement naming
//!   [`GUARD_MARK`]; `failed` turns that into [`refusal`] and
//!   `Session::guarded` retires the session. Never a grant, never a lock
//!   left behind. The guard is inside the statement: no extra round trip;
//!   when it matches it costs one `current_setting` and a comparison.
//!   Shown through a real PgBouncer (transaction mode, 6 server sessions
//!   lent round robin) by `the_guard_acts_only_on_the_claimed_server_session`
//!   in `tests/tests/postgres_pooler.rs`.
//! - A statement that still lands where its prepared statement does not
//!   exist (SQLSTATE 26000), or whose prepare finds one of the same name
//!   (42P05, another process's), is reported with the same explanation.
//!
//! The claim and the probe only read and write the custom setting: a
//! server session of another application through the same pooler is not
//! disturbed. The guard's end of a claimed server session is the one
//! exception: that server session carries a dlock session's claim, but a
//! transaction pooler may be running another client's transaction on it
//! at that moment, which then fails.

use super::config::Config;
use super::{failed, Failure};
use crate::LockError;

/// The custom setting that names the dlock session a server session
/// belongs to.
const CLAIM: &str = "dlock.session";

/// The words a failed guard's error carries (see [`guard`]).
pub(super) const GUARD_MARK: &str = "dlock-pooler-guard";

/// The per-statement guard on the parameter `$n` (the session's claim
/// token, `<id>.<pid>.<backend start in µs>`): true on the server session
/// the token was claimed on; anywhere else it ends that claimed server
/// session (`pg_terminate_backend`, so the advisory locks it holds are
/// freed: a transaction pooler would keep it open for other clients) and
/// fails the statement with an error naming [`GUARD_MARK`]. Each
/// statement that takes, checks or lets go an advisory lock puts it in
/// the `WHERE` of the query that calls the lock function (a condition
/// without columns, checked once before that query's rows are made), so
/// nothing acts elsewhere. The `ELSE` is a subquery, run only when
/// reached, so a matching guard costs one `current_setting`.
pub(super) fn guard(n: u8) -> String {
    guard_on(&format!("${n}"))
}

/// The [`guard`] on the token `token`, an SQL expression (a parameter, or
/// a quoted literal where a statement takes no parameters: a `DO` block).
pub(super) fn guard_on(token: &str) -> String {
    format!(
        "(CASE WHEN current_setting('{CLAIM}', true) = {token}::text THEN true ELSE \
         (SELECT ('{GUARD_MARK}: ended ' || count(pg_terminate_backend(a.pid)))::bool \
           FROM pg_stat_get_activity(NULL) a WHERE a.pid::text = split_part({token}::text, '.', 2) \
           AND (EXTRACT(EPOCH FROM a.backend_start) * 1000000)::int8::text = split_part({token}::text, '.', 3)) END)"
    )
}

/// Whether `e` is a failed [`guard`].
pub(super) fn is_guard_refusal(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.message().contains(GUARD_MARK))
}

/// The SQLSTATE of "prepared statement … does not exist".
pub(super) const NO_SUCH_STATEMENT: &str = "26000";

/// The SQLSTATE of "prepared statement … already exists": tokio-postgres
/// names its statements `s0`, `s1`, … in the same order in every process,
/// so only a server session another process's connection prepared on, lent
/// by a pooler, already has one.
pub(super) const STATEMENT_EXISTS: &str = "42P05";

/// Why a pooler is refused and what to do instead, behind `shown`'s name.
pub(super) fn refusal(shown: &str, seen: &str) -> LockError {
    LockError::invalid_option(format!(
        "`{shown}` leads to a transaction or statement pooler (PgBouncer with pool_mode = transaction \
         or statement, Supavisor's transaction port 6543, or the like): {seen}. dlock's locks are \
         session advisory locks, which such a pooler hands to other clients; connect dlock through \
         a session pooler (PgBouncer `pool_mode = session`, Supavisor's session port 5432) or \
         straight to PostgreSQL (a second URL that bypasses the pooler)"
    ))
}

/// A random id for one session's claim.
fn new_id() -> String {
    let high = getrandom::u64().unwrap_or_default();
    let low = getrandom::u64().unwrap_or_else(|_| {
        // No randomness: the process and the clock still tell sessions of
        // different clients apart.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        (nanos as u64) ^ u64::from(std::process::id())
    });
    format!("{high:016x}{low:016x}")
}

/// The claim statement for `id`: the claim already there, this server
/// session's advisory locks, its pid, and the claim written (only on a
/// server session nobody claimed and holding no advisory lock): the token
/// `<id>.<pid>.<backend start in µs>` every guarded statement passes.
fn claim_statement(id: &str) -> String {
    format!(
        "SELECT s.before, s.locks::text, s.pid::text, \
           CASE WHEN s.before = '' AND s.locks = 0 THEN set_config('{CLAIM}', '{id}.' || s.pid || '.' || s.started, false) END \
         FROM (SELECT coalesce(current_setting('{CLAIM}', true), '') AS before, \
           (SELECT count(*) FROM pg_catalog.pg_locks l \
             WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()) AS locks, \
           pg_backend_pid() AS pid, \
           (SELECT (EXTRACT(EPOCH FROM a.backend_start) * 1000000)::int8 FROM pg_catalog.pg_stat_activity a \
             WHERE a.pid = pg_backend_pid()) AS started) s"
    )
}

/// The first row of a simple query's answer, as text columns.
fn first_row(messages: Vec<tokio_postgres::SimpleQueryMessage>) -> Option<Vec<Option<String>>> {
    messages.into_iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(
            (0..row.len())
                .map(|i| row.get(i).map(str::to_owned))
                .collect(),
        ),
        _ => None,
    })
}

/// Runs `settings` (the session's `SET`s) and the claim in one simple
/// query (one transaction, so one server session even behind a pooler);
/// the server pid of the session and its claim token, or the pooler's
/// refusal.
pub(super) async fn claim(
    client: &tokio_postgres::Client,
    settings: &str,
    shown: &str,
) -> Result<(i32, String), LockError> {
    let id = new_id();
    let batch = format!("{settings}; {}", claim_statement(&id));
    let messages = client
        .simple_query(&batch)
        .await
        .map_err(|e| failed(shown, e))?;
    let row = first_row(messages).unwrap_or_default();
    let column = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let (before, locks, pid, written) = (column(0), column(1), column(2), column(3));
    if !before.is_empty() {
        return Err(refusal(
            shown,
            "a new connection was given a server session another dlock session already uses",
        ));
    }
    if locks != "0" {
        return Err(refusal(
            shown,
            &format!("a new connection was given a server session that already holds {locks} advisory lock(s) of another client"),
        ));
    }
    if !written.starts_with(&format!("{id}.{pid}.")) {
        return Err(failed(
            shown,
            format!("the session's claim was not written (answer: {row:?})"),
        ));
    }
    let pid = pid.parse().map_err(|_| {
        failed(
            shown,
            format!("pg_backend_pid() answered {pid:?}, not a process id"),
        )
    })?;
    Ok((pid, written))
}

/// Asks the short second connection `client` (opened by the caller) for
/// its claim and pid; refuses when it landed on a claimed server session
/// or on the server session `pid` (a transaction pooler lending the
/// first one again).
pub(super) async fn probe(
    client: &tokio_postgres::Client,
    config: &Config,
    shown: &str,
    pid: i32,
) -> Result<(), LockError> {
    let question =
        format!("SELECT coalesce(current_setting('{CLAIM}', true), ''), pg_backend_pid()::text");
    let asked = client.simple_query(&question);
    let answer = tokio::time::timeout(config.session.timeout, asked).await;
    let messages = match answer {
        Ok(Ok(messages)) => messages,
        Ok(Err(e)) => return Err(failed(shown, e)),
        Err(_) => {
            return Err(failed(
                shown,
                Failure::unanswered(format!(
                    "the pooler probe did not answer within {:?}",
                    config.session.timeout
                )),
            ))
        }
    };
    let row = first_row(messages).unwrap_or_default();
    let claimed = row.first().cloned().flatten().unwrap_or_default();
    let other_pid = row.get(1).cloned().flatten().unwrap_or_default();
    if !claimed.is_empty() {
        return Err(refusal(
            shown,
            "a second connection was given a server session a dlock session already uses",
        ));
    }
    if other_pid == pid.to_string() {
        return Err(refusal(
            shown,
            &format!("two open connections were both served by the server process {pid}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_32_hex_digits_and_differ() {
        let (a, b) = (new_id(), new_id());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn a_failed_guard_and_a_duplicate_statement_are_the_pooler_refusal() {
        for text in [
            format!(
                "ERROR 22P02: invalid input syntax for type boolean: \"{GUARD_MARK}: ended 1\""
            ),
            "ERROR 42P05: prepared statement \"s3\" already exists".to_owned(),
            "ERROR 26000: prepared statement \"s3\" does not exist".to_owned(),
        ] {
            let e = super::super::failed("postgres://h/db", text.clone()).to_string();
            assert!(
                e.contains("pooler") && e.contains("pool_mode = session"),
                "{text} gave: {e}"
            );
        }
    }

    #[test]
    fn the_guard_compares_its_parameter_and_ends_only_the_claimed_session() {
        let g = guard(4);
        assert!(g.contains("current_setting('dlock.session', true) = $4::text"));
        assert!(g.contains("split_part($4::text, '.', 2)"));
        assert!(g.contains(GUARD_MARK));
        assert!(!g.contains("$1"));
    }

    #[test]
    fn the_refusal_names_the_pooler_and_the_fixes() {
        let e = refusal("postgres://h/db", "seen").to_string();
        for needed in [
            "PgBouncer",
            "pool_mode = session",
            "straight to PostgreSQL",
            "seen",
        ] {
            assert!(e.contains(needed), "{needed} missing from: {e}");
        }
    }
}
