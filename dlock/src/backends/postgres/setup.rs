//! What a backend checks and makes before it trusts a server: a primary,
//! a `search_path` that reaches only the system's code, and dlock's tables,
//! owned by a role dlock trusts.
//!
//! PostgreSQL resolves an unqualified function, operator or type through
//! the session's `search_path`, and a function in a schema another role
//! may create in (`public`, on PostgreSQL 14 and older) that matches the
//! arguments better than the system's wins over it: it would run as
//! dlock's role. Every session dlock opens therefore runs
//! [`PIN_SEARCH_PATH`] first. Tables are always written with their schema;
//! a table of dlock's name that another role made (with a trigger or a
//! rule, which run as the role that writes the table) is refused by
//! [`check_owners`].

use super::config::Config;
use super::failed;
use super::sql::Statements;
use crate::LockError;

/// The first statement of every session: only `pg_catalog` is searched
/// for functions, operators and types (`pg_temp` is named last, so that
/// PostgreSQL does not search it first; functions are never looked up
/// there).
pub(super) const PIN_SEARCH_PATH: &str = "SET search_path = pg_catalog, pg_temp";

/// dlock's tables of `schema` among `tables` (quoted, schema-qualified
/// names) whose owner dlock does not trust: (table, owner, this role).
/// Trusted: this role, a role it is a member of, a superuser (a superuser
/// running dlock trusts only itself and other superusers, since
/// PostgreSQL makes it a member of every role).
const UNTRUSTED_OWNERS: &str =
    "SELECT c.relname::text, pg_catalog.pg_get_userbyid(c.relowner)::text, current_user::text \
     FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
     JOIN pg_catalog.pg_roles o ON o.oid = c.relowner \
     JOIN pg_catalog.pg_roles me ON me.rolname = current_user \
     WHERE n.nspname = $1::text AND c.relname = ANY ($2::text[]) \
     AND NOT (o.oid = me.oid OR o.rolsuper \
       OR (NOT me.rolsuper AND pg_catalog.pg_has_role(me.oid, o.oid, 'MEMBER'))) \
     ORDER BY c.relname";

/// Refuses dlock's tables `tables` of `schema` if a role dlock does not
/// trust owns one: its triggers and rules would run as dlock's role.
pub(super) async fn check_owners(
    client: &tokio_postgres::Client,
    config: &Config,
    schema: &str,
    tables: &[&String],
    shown: &str,
) -> Result<(), LockError> {
    let names: Vec<&str> = tables
        .iter()
        .map(|t| t.rsplit('.').next().unwrap_or(t))
        .collect();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&schema, &names];
    let asked = client.query(UNTRUSTED_OWNERS, &params);
    let rows = match tokio::time::timeout(config.session.timeout, asked).await {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return Err(failed(shown, e)),
        Err(_) => return Err(failed(shown, "the server did not answer")),
    };
    let Some(row) = rows.first() else {
        return Ok(());
    };
    let (table, owner, me): (&str, &str, &str) = (row.get(0), row.get(1), row.get(2));
    Err(LockError::invalid_option(format!(
        "`{shown}`: the table \"{schema}\".{table} is owned by the role `{owner}`, which this role (`{me}`) is not a member of: \
         its triggers and rules would run as `{me}`, so dlock does not use it; \
         drop it or have it run `ALTER TABLE \"{schema}\".{table} OWNER TO {me}` if it is dlock's, \
         or name a schema only trusted roles may create in with `?schema=`"
    )))
}

/// Refuses a standby: its advisory locks exclude nobody on the primary,
/// and it cannot write fences.
pub(super) async fn check_server(
    client: &tokio_postgres::Client,
    config: &Config,
    shown: &str,
) -> Result<(), LockError> {
    let answer = tokio::time::timeout(
        config.session.timeout,
        client.query_one("SELECT pg_is_in_recovery()", &[]),
    )
    .await;
    let in_recovery: bool = match answer {
        Ok(Ok(row)) => row.get(0),
        Ok(Err(e)) => return Err(failed(shown, e)),
        Err(_) => return Err(failed(shown, "the server did not answer")),
    };
    if in_recovery {
        return Err(LockError::invalid_option(format!(
            "`{shown}` is a read-only standby (pg_is_in_recovery() is true): locks must be taken on the primary; list the primary, or every host with `?target_session_attrs=read-write`"
        )));
    }
    Ok(())
}

/// Creates the fence and holder tables on first use; a clear error when the
/// role may not.
pub(super) async fn ensure_table(
    client: &tokio_postgres::Client,
    config: &Config,
    statements: &Statements,
    shown: &str,
) -> Result<(), LockError> {
    let asked = async {
        client
            .query_one(
                "SELECT to_regclass($1::text) IS NOT NULL AND to_regclass($2::text) IS NOT NULL",
                &[&statements.table, &statements.holders],
            )
            .await
    };
    let exists: bool = match tokio::time::timeout(config.session.timeout, asked).await {
        Ok(Ok(row)) => row.get(0),
        Ok(Err(e)) => return Err(failed(shown, e)),
        Err(_) => return Err(failed(shown, "the server did not answer")),
    };
    if !exists {
        create_tables(client, statements, shown).await?;
    }
    let tables = [&statements.table, &statements.holders];
    check_owners(client, config, &config.schema, &tables, shown).await
}

/// Runs `CREATE TABLE IF NOT EXISTS` for the fence and holder tables.
async fn create_tables(
    client: &tokio_postgres::Client,
    statements: &Statements,
    shown: &str,
) -> Result<(), LockError> {
    match create_if_missing(client, &statements.create_tables()).await {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.code(),
                Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
                    | Some(&tokio_postgres::error::SqlState::INVALID_SCHEMA_NAME)
            ) =>
        {
            Err(LockError::invalid_option(format!(
                "`{shown}`: the tables {table} and {holders} are missing and this role may not create them ({e}); \
                 have a role this one is a member of run `{create}` and `GRANT SELECT, INSERT, UPDATE, DELETE ON {table}, {holders} TO <role>` \
                 (dlock uses tables owned only by its role, a role it is a member of, or a superuser), \
                 or name a schema the role may create tables in with `?schema=`",
                table = statements.table,
                holders = statements.holders,
                create = statements.create_tables(),
                e = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned()),
            )))
        }
        Err(e) => Err(failed(shown, e)),
    }
}

/// Runs `create` (`CREATE … IF NOT EXISTS` statements), again when another
/// session created the same objects at the same moment.
///
/// PostgreSQL checks `IF NOT EXISTS` before it writes its catalogs, so two
/// sessions creating a table at once can both pass the check; the later
/// one then waits on the catalog's unique index for the first one's
/// transaction and fails: "type … already exists" (42710), "relation …
/// already exists" (42P07) or a unique violation (23505). The whole batch
/// is rolled back with it, so a table later in the batch may still be
/// missing if the other session's batch was different: run again, the
/// check now sees what the other committed.
pub(super) async fn create_if_missing(
    client: &tokio_postgres::Client,
    create: &str,
) -> Result<(), tokio_postgres::Error> {
    const TRIES: usize = 3;
    let mut tries = 1;
    loop {
        match client.batch_execute(create).await {
            Err(e) if tries < TRIES && created_meanwhile(&e) => tries += 1,
            done => return done,
        }
    }
}

/// Whether `e` is a creation that lost a race with another session's.
fn created_meanwhile(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        e.code(),
        Some(&SqlState::UNIQUE_VIOLATION)
            | Some(&SqlState::DUPLICATE_OBJECT)
            | Some(&SqlState::DUPLICATE_TABLE)
    )
}

impl super::PostgresBackend {
    /// Creates the table `table` with `create` if it is missing (asked
    /// first: `CREATE … IF NOT EXISTS` needs the CREATE right even when the
    /// table is there), and refuses it when a role dlock does not trust
    /// owns it (its triggers would run as dlock's role).
    pub(super) async fn ensure_table_of(
        &self,
        table: &str,
        create: &str,
        what: &str,
    ) -> Result<(), LockError> {
        let session = self.any_session().await?;
        let exists: bool = self
            .bounded(
                session
                    .client
                    .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&table]),
            )
            .await?
            .get(0);
        let created = async {
            if exists {
                Ok(())
            } else {
                super::setup::create_if_missing(&session.client, create).await
            }
        };
        match tokio::time::timeout(self.config.session.timeout, created).await {
            Err(_) => return Err(self.silent()),
            Ok(Ok(())) => {}
            Ok(Err(e))
                if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) =>
            {
                return Err(LockError::invalid_option(format!(
                    "`{shown}`: the table {table} of {what} is missing and this role may not create it ({e}); \
                     have a role this one is a member of (or a superuser) run `{create}` and `GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO <role>`",
                    shown = self.shown,
                    e = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned()),
                )));
            }
            Ok(Err(e)) => return Err(failed(&self.shown, e)),
        }
        let table = table.to_owned();
        let (config, shown) = (&self.config, &self.shown);
        super::setup::check_owners(&session.client, config, &config.schema, &[&table], shown).await
    }
}
