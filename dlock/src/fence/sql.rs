//! Fenced writes in SQL for a table of the caller's: one builder that
//! spells the statement for PostgreSQL and for MySQL/MariaDB.
//!
//! Both dialects come out of the same code: what differs (quoting, the
//! placeholder, how the proposed row of an upsert is named) is asked of
//! [`SqlDialect`], so a statement's shape is written once.

use super::FenceError;

/// The SQL dialect a fenced statement is spelled in.
///
/// ```
/// use dlock::fence::{FencedUpdate, SqlDialect};
/// let update = FencedUpdate::new("orders", "id").set("status");
/// for dialect in [SqlDialect::Postgres, SqlDialect::MySql] {
///     assert!(update.sql(dialect).unwrap().starts_with("UPDATE"));
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SqlDialect {
    /// PostgreSQL: identifiers in `"…"`, parameters `$1`, `$2`, ….
    Postgres,
    /// MySQL and MariaDB: identifiers in `` `…` ``, parameters `?`.
    MySql,
}

impl SqlDialect {
    /// The longest identifier the server keeps as written: PostgreSQL
    /// truncates longer ones (63 bytes), which could name another column;
    /// MySQL refuses them (64 characters).
    fn check_length(self, name: &str) -> Result<(), String> {
        match self {
            SqlDialect::Postgres if name.len() > 63 => Err(format!(
                "{} bytes is longer than PostgreSQL's 63 (it would truncate the name)",
                name.len()
            )),
            SqlDialect::MySql if name.chars().count() > 64 => Err(format!(
                "{} characters is longer than MySQL's 64",
                name.chars().count()
            )),
            SqlDialect::MySql if name.ends_with(' ') => {
                Err("MySQL names cannot end with a space".to_owned())
            }
            _ => Ok(()),
        }
    }

    /// The identifier quoted, its quote character doubled inside.
    fn quote(self, name: &str) -> String {
        let q = match self {
            SqlDialect::Postgres => '"',
            SqlDialect::MySql => '`',
        };
        let mut out = String::with_capacity(name.len() + 2);
        out.push(q);
        for c in name.chars() {
            if c == q {
                out.push(q);
            }
            out.push(c);
        }
        out.push(q);
        out
    }

    /// Whether two column names are one column: quoted PostgreSQL names are
    /// case-sensitive, MySQL column names are not.
    fn same_column(self, a: &str, b: &str) -> bool {
        match self {
            SqlDialect::Postgres => a == b,
            SqlDialect::MySql => a.to_lowercase() == b.to_lowercase(),
        }
    }

    /// How an upsert's conflict clause names the value the statement
    /// proposed for `column` (quoted).
    fn proposed(self, column: &str) -> String {
        match self {
            SqlDialect::Postgres => format!("EXCLUDED.{column}"),
            SqlDialect::MySql => format!("VALUES({column})"),
        }
    }

    /// How an upsert's conflict clause names the stored row's `column`
    /// (quoted); PostgreSQL's stored row goes by the alias [`STORED`].
    fn stored(self, column: &str) -> String {
        match self {
            SqlDialect::Postgres => format!("{STORED}.{column}"),
            SqlDialect::MySql => column.to_owned(),
        }
    }
}

/// PostgreSQL's alias for the row already stored, in an upsert (a table
/// named like a keyword or like `EXCLUDED` still reads unambiguously).
const STORED: &str = "\"stored\"";

/// One argument of a fenced statement, by what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arg {
    /// The value of the `i`th `set` column.
    Value(usize),
    Key,
    Token,
}

/// Writes placeholders and remembers the order the server binds them in.
struct Binder {
    dialect: SqlDialect,
    values: usize,
    /// MySQL's `?` bind in the order they appear in the text.
    order: Vec<Arg>,
}

impl Binder {
    fn new(dialect: SqlDialect, values: usize) -> Self {
        Binder {
            dialect,
            values,
            order: Vec::new(),
        }
    }

    fn placeholder(&mut self, arg: Arg) -> String {
        match self.dialect {
            SqlDialect::Postgres => format!("${}", self.number(arg)),
            SqlDialect::MySql => {
                self.order.push(arg);
                "?".to_owned()
            }
        }
    }

    /// PostgreSQL's number for `arg`: the set values, then the key, then
    /// the token, whatever order the text uses them in.
    fn number(&self, arg: Arg) -> usize {
        match arg {
            Arg::Value(i) => i + 1,
            Arg::Key => self.values + 1,
            Arg::Token => self.values + 2,
        }
    }

    /// The arguments in the order the server binds them.
    fn order(self) -> Vec<Arg> {
        match self.dialect {
            SqlDialect::Postgres => (0..self.values)
                .map(Arg::Value)
                .chain([Arg::Key, Arg::Token])
                .collect(),
            SqlDialect::MySql => self.order,
        }
    }
}

/// The identifiers of a fenced statement, checked and quoted for one dialect.
struct Quoted {
    table: String,
    key: String,
    set: Vec<String>,
    fence: String,
}

/// Builds the fenced write for a table of yours: an `UPDATE` (or an upsert)
/// that writes the row with key `key` only under a fencing token at least as
/// high as the one the row's fence column holds, and stores the token there
/// in the same statement. A stale holder's write changes **0 rows**: check
/// the count, and stop when it is 0.
///
/// - Identifiers are quoted for the dialect (PostgreSQL `"…"` with `"`
///   doubled, MySQL `` `…` `` with `` ` `` doubled), so any name works: a
///   space, a quote, mixed case. A `.` in the table name is part of the name;
///   qualify the table with [`schema`](Self::schema).
/// - Values are never in the text: they are bound as parameters. The
///   parameters are the **set values (in `set` order), then the key, then
///   the token**; PostgreSQL numbers them so (`$1`…`$n`, `$n+1`, `$n+2`).
///   MySQL's `?` bind in text order, and the `UPDATE` there needs the token
///   twice: [`arguments`](Self::arguments) puts yours in the order the
///   dialect's `UPDATE` binds them.
/// - The rule is [`FenceKeeper`](super::FenceKeeper)'s: a token equal to the
///   stored one writes (the same lease writing again), a lower one is
///   refused. A NULL fence counts as never fenced: the first fenced write
///   takes the row. Give the column `BIGINT NOT NULL DEFAULT 0` (or
///   nullable); tokens fit a signed 64-bit integer (`token as i64`).
/// - [`sql`](Self::sql) updates an existing row only (no row: 0 rows, as a
///   refusal would); [`upsert_sql`](Self::upsert_sql) also inserts the row
///   when there is none (the key column needs a unique index).
///
/// ```
/// use dlock::fence::{FencedUpdate, SqlDialect};
///
/// let update = FencedUpdate::new("Orders", "id")
///     .schema("billing")
///     .set("status")
///     .set("paid at");
/// assert_eq!(
///     update.postgres().unwrap(),
///     r#"UPDATE "billing"."Orders" SET "status" = $1, "paid at" = $2, "fence" = $4 WHERE "id" = $3 AND ("fence" IS NULL OR "fence" <= $4)"#
/// );
/// assert_eq!(
///     update.mysql().unwrap(),
///     "UPDATE `billing`.`Orders` SET `status` = ?, `paid at` = ?, `fence` = ? WHERE `id` = ? AND (`fence` IS NULL OR `fence` <= ?)"
/// );
/// // Bad input is an error naming it, before anything reaches a server.
/// let err = FencedUpdate::new("orders", "id").set("fence").postgres().unwrap_err();
/// assert!(err.to_string().contains("\"fence\""));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedUpdate {
    schema: Option<String>,
    table: String,
    key_column: String,
    set: Vec<String>,
    fence_column: String,
}

impl FencedUpdate {
    /// A fenced write to the row of `table` whose `key_column` equals the
    /// key; the fence column is `fence` until [`fence_column`](Self::fence_column)
    /// names another. Nothing is checked until a statement is spelled.
    ///
    /// ```
    /// let update = dlock::fence::FencedUpdate::new("orders", "id").set("status");
    /// assert!(update.postgres().is_ok());
    /// ```
    pub fn new(table: impl Into<String>, key_column: impl Into<String>) -> Self {
        FencedUpdate {
            schema: None,
            table: table.into(),
            key_column: key_column.into(),
            set: Vec::new(),
            fence_column: "fence".to_owned(),
        }
    }

    /// Qualifies the table with a schema (on MySQL: a database):
    /// `"schema"."table"`.
    ///
    /// ```
    /// let update = dlock::fence::FencedUpdate::new("orders", "id").schema("shop").set("status");
    /// assert!(update.postgres().unwrap().starts_with(r#"UPDATE "shop"."orders""#));
    /// ```
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Adds a column to set; its value is the next parameter.
    ///
    /// ```
    /// let update = dlock::fence::FencedUpdate::new("orders", "id").set("status").set("note");
    /// assert!(update.postgres().unwrap().contains(r#""status" = $1, "note" = $2"#));
    /// ```
    pub fn set(mut self, column: impl Into<String>) -> Self {
        self.set.push(column.into());
        self
    }

    /// Names the column that keeps the token of the last write (`fence` by
    /// default).
    ///
    /// ```
    /// let update = dlock::fence::FencedUpdate::new("orders", "id")
    ///     .set("status")
    ///     .fence_column("lock_fence");
    /// assert!(update.postgres().unwrap().contains(r#""lock_fence" <= $3"#));
    /// ```
    pub fn fence_column(mut self, column: impl Into<String>) -> Self {
        self.fence_column = column.into();
        self
    }

    /// The fenced `UPDATE` for PostgreSQL: [`sql`](Self::sql) with
    /// [`SqlDialect::Postgres`].
    ///
    /// # Errors
    /// As [`sql`](Self::sql).
    ///
    /// ```no_run
    /// # async fn pay(guard: &dlock::LockGuard, db: &tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let sql = dlock::fence::FencedUpdate::new("orders", "id").set("status").postgres()?;
    /// let token = guard.fencing_token().expect("a fencing backend") as i64;
    /// if db.execute(&sql, &[&"paid", &42_i64, &token]).await? == 0 {
    ///     // A later holder has written: this holder's lease is over. Stop.
    /// }
    /// # Ok(()) }
    /// ```
    pub fn postgres(&self) -> Result<String, FenceError> {
        self.sql(SqlDialect::Postgres)
    }

    /// The fenced `UPDATE` for MySQL and MariaDB: [`sql`](Self::sql) with
    /// [`SqlDialect::MySql`]. Bind the arguments in the order
    /// [`arguments`](Self::arguments) gives (the token twice).
    ///
    /// # Errors
    /// As [`sql`](Self::sql).
    ///
    /// ```
    /// let sql = dlock::fence::FencedUpdate::new("orders", "id").set("status").mysql().unwrap();
    /// assert_eq!(sql.matches('?').count(), 4); // status, token, id, token
    /// ```
    pub fn mysql(&self) -> Result<String, FenceError> {
        self.sql(SqlDialect::MySql)
    }

    /// The fenced `UPDATE` in `dialect`: sets the columns and the fence
    /// column to the token where the key matches and the stored fence is
    /// NULL or at most the token. It changes 1 row, or 0 when the token is
    /// stale (or there is no such row).
    ///
    /// On MySQL the count is of rows *changed* unless the connection asks
    /// for found rows (`client_found_rows`): the same lease writing the same
    /// values again counts 0 there without it, as a refusal would.
    ///
    /// # Errors
    /// [`FenceError::InvalidIdentifier`] for an empty name, a NUL in one, or
    /// one the dialect cannot keep; [`FenceError::NoColumnsToSet`];
    /// [`FenceError::DuplicateColumn`] when a column is set twice, or the key
    /// or fence column is among the set ones.
    ///
    /// ```
    /// use dlock::fence::{FencedUpdate, SqlDialect};
    /// let update = FencedUpdate::new("orders", "id").set("status");
    /// assert_eq!(update.sql(SqlDialect::Postgres).unwrap(), update.postgres().unwrap());
    /// ```
    pub fn sql(&self, dialect: SqlDialect) -> Result<String, FenceError> {
        Ok(self.update(dialect)?.0)
    }

    /// The fenced upsert in `dialect`: inserts the row when the key is new
    /// (fence = the token), and otherwise updates it as [`sql`](Self::sql)
    /// does, under the same rule. The key column needs a unique index (a
    /// primary key). Parameters: the set values, the key, the token, in both
    /// dialects.
    ///
    /// - PostgreSQL: `INSERT … ON CONFLICT (key) DO UPDATE … WHERE`; it
    ///   counts 1 row for an insert or an update, 0 for a stale token.
    /// - MySQL/MariaDB: `INSERT … ON DUPLICATE KEY UPDATE`, each column kept
    ///   as it is for a stale token (`VALUES()`, which MySQL 8 warns about
    ///   and MariaDB needs); it counts 1 for an insert, 2 for an update and
    ///   0 when nothing changed: a stale token, or the same lease writing the
    ///   same values again. Leave `client_found_rows` off (the default) on
    ///   this connection: with it, a refused upsert counts 1.
    ///
    /// # Errors
    /// As [`sql`](Self::sql).
    ///
    /// ```
    /// use dlock::fence::{FencedUpdate, SqlDialect};
    /// let upsert = FencedUpdate::new("orders", "id").set("status");
    /// assert_eq!(
    ///     upsert.upsert_sql(SqlDialect::Postgres).unwrap(),
    ///     r#"INSERT INTO "orders" AS "stored" ("status", "id", "fence") VALUES ($1, $2, $3) ON CONFLICT ("id") DO UPDATE SET "status" = EXCLUDED."status", "fence" = EXCLUDED."fence" WHERE "stored"."fence" IS NULL OR "stored"."fence" <= EXCLUDED."fence""#
    /// );
    /// ```
    pub fn upsert_sql(&self, dialect: SqlDialect) -> Result<String, FenceError> {
        let q = self.quoted(dialect)?;
        let mut bind = Binder::new(dialect, q.set.len());
        let columns: Vec<&str> = q
            .set
            .iter()
            .chain([&q.key, &q.fence])
            .map(String::as_str)
            .collect();
        let args = (0..q.set.len())
            .map(Arg::Value)
            .chain([Arg::Key, Arg::Token]);
        let values: Vec<String> = args.map(|arg| bind.placeholder(arg)).collect();
        let alias = match dialect {
            SqlDialect::Postgres => format!(" AS {STORED}"),
            SqlDialect::MySql => String::new(),
        };
        let head = format!(
            "INSERT INTO {}{alias} ({}) VALUES ({})",
            q.table,
            columns.join(", "),
            values.join(", ")
        );
        let newer = format!(
            "{stored} IS NULL OR {stored} <= {proposed}",
            stored = dialect.stored(&q.fence),
            proposed = dialect.proposed(&q.fence)
        );
        let written = q.set.iter().chain([&q.fence]);
        Ok(match dialect {
            SqlDialect::Postgres => {
                let sets: Vec<String> = written
                    .map(|c| format!("{c} = {}", dialect.proposed(c)))
                    .collect();
                format!(
                    "{head} ON CONFLICT ({}) DO UPDATE SET {} WHERE {newer}",
                    q.key,
                    sets.join(", ")
                )
            }
            // Assignments run left to right, each seeing the ones before: the
            // fence is written last, so every column's test sees the old one.
            SqlDialect::MySql => {
                let sets: Vec<String> = written
                    .map(|c| format!("{c} = IF({newer}, {}, {c})", dialect.proposed(c)))
                    .collect();
                format!("{head} ON DUPLICATE KEY UPDATE {}", sets.join(", "))
            }
        })
    }

    /// Your arguments in the order `dialect`'s fenced `UPDATE`
    /// ([`sql`](Self::sql)) binds them: `values` (one per `set` column, in
    /// order), `key` and `token`, each where the statement needs it
    /// (PostgreSQL: values, key, token; MySQL: values, token, key, token).
    /// `T` is whatever your client binds: `&(dyn ToSql + Sync)` for
    /// `tokio-postgres`, `mysql_async::Value`, ….
    ///
    /// # Errors
    /// [`FenceError::ValueCount`] when `values` are not one per `set`
    /// column; the errors of [`sql`](Self::sql).
    ///
    /// ```
    /// use dlock::fence::{FencedUpdate, SqlDialect};
    /// let update = FencedUpdate::new("orders", "id").set("status").set("note");
    /// let args = update.arguments(SqlDialect::MySql, ["paid", "by card"], "42", "7").unwrap();
    /// assert_eq!(args, ["paid", "by card", "7", "42", "7"]);
    /// ```
    pub fn arguments<T: Clone>(
        &self,
        dialect: SqlDialect,
        values: impl IntoIterator<Item = T>,
        key: T,
        token: T,
    ) -> Result<Vec<T>, FenceError> {
        let values: Vec<T> = values.into_iter().collect();
        let (_, order) = self.update(dialect)?;
        if values.len() != self.set.len() {
            return Err(FenceError::ValueCount {
                columns: self.set.len(),
                values: values.len(),
            });
        }
        Ok(order
            .into_iter()
            .map(|arg| match arg {
                Arg::Value(i) => values[i].clone(),
                Arg::Key => key.clone(),
                Arg::Token => token.clone(),
            })
            .collect())
    }

    /// The `UPDATE` and the order its parameters bind in.
    fn update(&self, dialect: SqlDialect) -> Result<(String, Vec<Arg>), FenceError> {
        let q = self.quoted(dialect)?;
        let mut bind = Binder::new(dialect, q.set.len());
        let mut sets: Vec<String> = q
            .set
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c} = {}", bind.placeholder(Arg::Value(i))))
            .collect();
        sets.push(format!("{} = {}", q.fence, bind.placeholder(Arg::Token)));
        let sql = format!(
            "UPDATE {} SET {} WHERE {} = {} AND ({fence} IS NULL OR {fence} <= {})",
            q.table,
            sets.join(", "),
            q.key,
            bind.placeholder(Arg::Key),
            bind.placeholder(Arg::Token),
            fence = q.fence,
        );
        Ok((sql, bind.order()))
    }

    /// Every identifier checked for `dialect`, and quoted.
    fn quoted(&self, dialect: SqlDialect) -> Result<Quoted, FenceError> {
        let ident = |what: &'static str, name: &str| -> Result<String, FenceError> {
            let refuse = |reason: String| FenceError::InvalidIdentifier {
                what,
                name: name.to_owned(),
                reason,
            };
            if name.is_empty() {
                return Err(refuse("it is empty".to_owned()));
            }
            if name.contains('\0') {
                return Err(refuse("it contains a NUL character".to_owned()));
            }
            dialect.check_length(name).map_err(refuse)?;
            Ok(dialect.quote(name))
        };
        let table = match &self.schema {
            Some(schema) => format!(
                "{}.{}",
                ident("schema", schema)?,
                ident("table", &self.table)?
            ),
            None => ident("table", &self.table)?,
        };
        let key = ident("key column", &self.key_column)?;
        let fence = ident("fence column", &self.fence_column)?;
        if self.set.is_empty() {
            return Err(FenceError::NoColumnsToSet {
                table: self.table.clone(),
            });
        }
        if dialect.same_column(&self.key_column, &self.fence_column) {
            return Err(FenceError::DuplicateColumn {
                column: self.fence_column.clone(),
                reason: "the fence column is the key column",
            });
        }
        let mut set = Vec::with_capacity(self.set.len());
        for (i, column) in self.set.iter().enumerate() {
            let twice = |reason| FenceError::DuplicateColumn {
                column: column.clone(),
                reason,
            };
            if dialect.same_column(column, &self.fence_column) {
                return Err(twice(
                    "it is the fence column, which the statement sets to the token itself",
                ));
            }
            if dialect.same_column(column, &self.key_column) {
                return Err(twice(
                    "it is the key column, which picks the row and is not set",
                ));
            }
            if self.set[..i].iter().any(|c| dialect.same_column(c, column)) {
                return Err(twice("it is set twice"));
            }
            set.push(ident("set column", column)?);
        }
        Ok(Quoted {
            table,
            key,
            set,
            fence,
        })
    }
}

#[cfg(test)]
mod tests;
