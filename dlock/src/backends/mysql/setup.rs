//! The first session's checks: dlock's table created if missing, and
//! refused when it is not what dlock made.
//!
//! MySQL has no table owners: any account with privileges on the database
//! can alter the table. What would let another account's code run, or a
//! fence go back, is refused: a view or a non-InnoDB table in its place (a
//! `MEMORY` table forgets its counters at a restart), and a trigger on it
//! (a trigger runs on every write of an acquisition). Triggers are listed
//! from `information_schema.TRIGGERS`, which shows only those on tables
//! the account has the `TRIGGER` privilege for: an account without it sees
//! none. The table is looked for first, so an account without `CREATE`
//! works on a table an administrator made (see the grants in the module
//! docs).

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::names::hex_literal;
use super::rows::{bytes, int, rows_of};
use super::sql::{Statements, TABLE};
use super::{failed, Failure};
use crate::LockError;

/// Creates the table if missing, and checks it.
pub(super) async fn ensure_table(
    conn: &mut Conn,
    database: &str,
    statements: &Statements,
    shown: &str,
) -> Result<(), LockError> {
    let find = format!(
        "SELECT TABLE_TYPE, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} AND TABLE_NAME = '{TABLE}'",
        hex_literal(database.as_bytes())
    );
    let found = rows_of(conn, find.clone())
        .await
        .map_err(|e| failed(shown, e))?;
    if found.rows.is_empty()
        && let Err(e) = conn.query_drop(statements.create()).await
    {
        let f = Failure::from(e);
        return Err(LockError::invalid_option(format!(
                "{shown}: dlock's table {} is missing and could not be created ({}): create it as an administrator (see the `CREATE TABLE` in `dlock::backends::mysql`'s docs) and grant SELECT, INSERT, UPDATE, DELETE on it, or grant CREATE on the database",
                statements.table, f.text
            )));
    }
    let found = rows_of(conn, find).await.map_err(|e| failed(shown, e))?;
    let Some(row) = found.rows.first() else {
        return Err(LockError::invalid_option(format!(
            "{shown}: dlock's table {} is not visible to this account: grant SELECT, INSERT, UPDATE, DELETE on it",
            statements.table
        )));
    };
    let kind = bytes(row, 0).map(|b| String::from_utf8_lossy(&b).into_owned());
    let engine = bytes(row, 1).map(|b| String::from_utf8_lossy(&b).into_owned());
    if kind.as_deref() != Some("BASE TABLE")
        || !engine
            .as_deref()
            .is_some_and(|e| e.eq_ignore_ascii_case("InnoDB"))
    {
        return Err(LockError::invalid_option(format!(
            "{shown}: {} is a {} with engine {}, not the InnoDB table dlock makes: drop it (dlock creates it again) or give dlock another database",
            statements.table,
            kind.as_deref().unwrap_or("?"),
            engine.as_deref().unwrap_or("none")
        )));
    }
    let triggers = format!(
        "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = {} AND EVENT_OBJECT_TABLE = '{TABLE}'",
        hex_literal(database.as_bytes())
    );
    let counted = rows_of(conn, triggers)
        .await
        .map_err(|e| failed(shown, e))?;
    if counted.rows.first().and_then(|r| int(r, 0)).unwrap_or(0) > 0 {
        return Err(LockError::invalid_option(format!(
            "{shown}: {} has a trigger, which would run on every acquisition: drop the trigger, or give dlock a table of its own",
            statements.table
        )));
    }
    privileges(conn, statements, shown).await
}

/// What every acquisition writes, tried on no row: `connect` fails here,
/// naming the missing privilege, the account and the GRANT to run, rather
/// than at the first acquisition. (`DELETE`, needed only by the retention
/// sweep, is not required.)
async fn privileges(
    conn: &mut Conn,
    statements: &Statements,
    shown: &str,
) -> Result<(), LockError> {
    let table = &statements.table;
    let probes = [
        ("SELECT", format!("SELECT fence FROM {table} WHERE FALSE")),
        (
            "INSERT",
            format!("INSERT INTO {table} (name, lock_key, fence) SELECT X'', X'', 0 FROM DUAL WHERE FALSE"),
        ),
        ("UPDATE", format!("UPDATE {table} SET fence = fence WHERE FALSE")),
    ];
    for (privilege, probe) in probes {
        let Err(e) = conn.query_drop(probe).await else {
            continue;
        };
        let denied = matches!(&e, mysql_async::Error::Server(s) if matches!(s.code, 1142 | 1143));
        if !denied {
            return Err(failed(shown, e));
        }
        let account: Option<String> = conn
            .query_first("SELECT CURRENT_USER()")
            .await
            .ok()
            .flatten();
        let account = account
            .and_then(|a| a.rsplit_once('@').map(|(u, h)| format!("'{u}'@'{h}'")))
            .unwrap_or_else(|| "<this account>".into());
        return Err(LockError::invalid_option(format!(
            "{shown}: the account {account} lacks the {privilege} privilege on {table}, which every acquisition needs ({}): run `GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {account}` as an administrator",
            Failure::from(e).text
        )));
    }
    Ok(())
}
