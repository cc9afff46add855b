//! The server's side of a soak: what dlock leaves on it (keys, rows, sessions,
//! connections, advisory locks, leases), read through a connection of the probe's own at
//! each sample, so that a leak on the server shows as a growing gauge.
//!
//! | backend | gauges | counters (shown only) |
//! |---|---|---|
//! | Redis | `keys` under the prefix (`SCAN`), `dbsize`, `clients` and `blocked_clients` (`INFO clients`), `pubsub_channels` | `used_memory_mb` |
//! | PostgreSQL | `sessions` (`pg_stat_activity`), `advisory_locks` (`pg_locks`), rows of `dlock_fences` and `dlock_holders` | |
//! | MySQL / MariaDB | `processlist`, `threads_connected`, rows of `dlock_fences` | `aborted_connects_total`, `aborted_clients_total` |
//! | etcd | `keys` under the prefix, `leases` | `revision`, `db_size_mb` |
//!
//! The probe's own connection counts in `clients`, `sessions` and `processlist`: one,
//! the same at every sample.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::urls::ServiceUrl;

/// How long one server sample may take before it counts as failed.
pub const SAMPLE_LIMIT: Duration = Duration::from_secs(10);

/// A connection to the soaked server, opened on first use and again after a failure.
pub struct ServerProbe {
    url: ServiceUrl,
    prefix: String,
    connection: Option<Connection>,
    logs: Vec<PathBuf>,
}

enum Connection {
    Redis(redis::aio::MultiplexedConnection),
    Postgres(tokio_postgres::Client),
    Mysql(mysql_async::Conn),
    Etcd(Box<etcd_client::Client>),
}

/// The key prefix in `url`'s query (`?prefix=app`), else dlock's default `dlock`.
///
/// ```
/// use dlock_torture::soak::server_sample::prefix_of;
/// assert_eq!(prefix_of("redis://h:1"), "dlock");
/// assert_eq!(prefix_of("etcd://h:1?timeout=1s&prefix=app"), "app");
/// ```
pub fn prefix_of(url: &str) -> String {
    url.split_once('?')
        .and_then(|(_, query)| {
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix("prefix="))
        })
        .unwrap_or("dlock")
        .to_string()
}

impl ServerProbe {
    /// A probe of the server at `url` (not connected yet), also counting the lines of
    /// `logs`.
    ///
    /// # Errors
    /// The URL cannot be taken apart.
    pub fn new(url: &str, logs: Vec<PathBuf>) -> Result<Self, String> {
        Ok(Self {
            url: ServiceUrl::parse(url)?,
            prefix: prefix_of(url),
            connection: None,
            logs,
        })
    }

    /// Which backends' servers this probe reads (others get log lines only).
    pub fn reads_server(&self) -> bool {
        matches!(
            self.url.scheme.as_str(),
            "redis" | "postgres" | "postgresql" | "mysql" | "mariadb" | "etcd"
        )
    }

    /// Adds the server's gauges and the log files' line counts to `values`. A failed or
    /// slow probe (over [`SAMPLE_LIMIT`]) leaves the server's out of this sample and is
    /// returned as an error; the next sample connects again.
    pub async fn sample(&mut self, values: &mut BTreeMap<String, f64>) -> Result<(), String> {
        for (i, log) in self.logs.iter().enumerate() {
            if let Some(lines) = count_lines(log) {
                values.insert(log_metric(i, log), lines as f64);
            }
        }
        if !self.reads_server() {
            return Ok(());
        }
        let mut read = BTreeMap::new();
        let outcome = tokio::time::timeout(SAMPLE_LIMIT, self.read(&mut read)).await;
        match outcome {
            Ok(Ok(())) => {
                let scheme = self.scheme_label();
                for (name, value) in read {
                    values.insert(format!("{scheme}.{name}"), value);
                }
                Ok(())
            }
            Ok(Err(e)) => {
                self.connection = None;
                Err(e)
            }
            Err(_) => {
                self.connection = None;
                Err(format!(
                    "the server sample took over {} s",
                    SAMPLE_LIMIT.as_secs()
                ))
            }
        }
    }

    fn scheme_label(&self) -> &'static str {
        match self.url.scheme.as_str() {
            "redis" => "redis",
            "postgres" | "postgresql" => "postgres",
            "mysql" | "mariadb" => "mysql",
            _ => "etcd",
        }
    }

    async fn read(&mut self, values: &mut BTreeMap<String, f64>) -> Result<(), String> {
        if self.connection.is_none() {
            self.connection = Some(self.connect().await?);
        }
        let prefix = self.prefix.clone();
        match self.connection.as_mut() {
            Some(Connection::Redis(c)) => read_redis(c, &prefix, values).await,
            Some(Connection::Postgres(c)) => read_postgres(c, values).await,
            Some(Connection::Mysql(c)) => read_mysql(c, values).await,
            Some(Connection::Etcd(c)) => read_etcd(c, &prefix, values).await,
            None => Ok(()),
        }
    }

    async fn connect(&self) -> Result<Connection, String> {
        let userinfo = self
            .url
            .userinfo
            .as_ref()
            .map_or(String::new(), |u| format!("{u}@"));
        // the path without dlock's own query parameters, which the clients would refuse
        let path = self.url.rest.split('?').next().unwrap_or("");
        let first = self.url.hosts.first().cloned().unwrap_or_default();
        match self.scheme_label() {
            "redis" => {
                let client = redis::Client::open(format!("redis://{userinfo}{first}{path}"))
                    .map_err(|e| format!("redis probe: {e}"))?;
                let c = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| format!("redis probe: {e}"))?;
                Ok(Connection::Redis(c))
            }
            "postgres" => {
                let url = format!("postgres://{userinfo}{first}{path}");
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| format!("postgres probe: {e}"))?;
                tokio::spawn(connection);
                Ok(Connection::Postgres(client))
            }
            "mysql" => {
                let opts = mysql_async::Opts::from_url(&format!("mysql://{userinfo}{first}{path}"))
                    .map_err(|e| format!("mysql probe: {e}"))?;
                let c = mysql_async::Conn::new(opts)
                    .await
                    .map_err(|e| format!("mysql probe: {e}"))?;
                Ok(Connection::Mysql(c))
            }
            _ => {
                let options = self.url.userinfo.as_ref().and_then(|u| {
                    let (user, pass) = u.split_once(':')?;
                    Some(etcd_client::ConnectOptions::new().with_user(user, pass))
                });
                let c = etcd_client::Client::connect(&self.url.hosts, options)
                    .await
                    .map_err(|e| format!("etcd probe: {e}"))?;
                Ok(Connection::Etcd(Box::new(c)))
            }
        }
    }
}

/// The metric name of the `i`th log file: `log_lines[<file name>]`.
fn log_metric(i: usize, path: &Path) -> String {
    let name = path
        .file_name()
        .map_or_else(|| format!("log{i}"), |n| n.to_string_lossy().into_owned());
    format!("log_lines[{name}]")
}

/// Lines in the file at `path` (its newlines); `None` if it cannot be read.
pub fn count_lines(path: &Path) -> Option<usize> {
    let bytes = std::fs::read(path).ok()?;
    Some(bytes.iter().filter(|b| **b == b'\n').count())
}

/// `field:value` from an `INFO` answer.
fn info_field(info: &str, field: &str) -> Option<f64> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

async fn read_redis(
    c: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    values: &mut BTreeMap<String, f64>,
) -> Result<(), String> {
    let e = |e: redis::RedisError| format!("redis probe: {e}");
    let dbsize: i64 = redis::cmd("DBSIZE").query_async(c).await.map_err(e)?;
    values.insert("dbsize".into(), dbsize as f64);
    // every key of dlock's namespace: `dlock:…`, and the `dlock-…` roots of its other kinds
    let pattern = format!("{prefix}*");
    let mut cursor = 0u64;
    let mut keys = 0usize;
    // bounded: SCAN ends when the cursor comes back to 0; the limit guards against a
    // server that never says so
    for _ in 0..100_000 {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(c)
            .await
            .map_err(e)?;
        keys += batch.len();
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    values.insert("keys".into(), keys as f64);
    let clients: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(c)
        .await
        .map_err(e)?;
    for field in ["connected_clients", "blocked_clients"] {
        if let Some(v) = info_field(&clients, field) {
            let name = if field == "connected_clients" {
                "clients"
            } else {
                field
            };
            values.insert(name.into(), v);
        }
    }
    let memory: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(c)
        .await
        .map_err(e)?;
    if let Some(bytes) = info_field(&memory, "used_memory") {
        values.insert("used_memory_mb".into(), bytes / 1_048_576.0);
    }
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(&pattern)
        .query_async(c)
        .await
        .map_err(e)?;
    values.insert("pubsub_channels".into(), channels.len() as f64);
    Ok(())
}

async fn read_postgres(
    c: &tokio_postgres::Client,
    values: &mut BTreeMap<String, f64>,
) -> Result<(), String> {
    let count = |sql: &'static str| async move {
        c.query_one(sql, &[])
            .await
            .map(|row| row.get::<_, i64>(0) as f64)
            .map_err(|e| format!("postgres probe `{sql}`: {e}"))
    };
    values.insert(
        "sessions".into(),
        count("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
            .await?,
    );
    values.insert(
        "advisory_locks".into(),
        count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").await?,
    );
    // the tables exist once dlock has connected; before that they are left out
    if let Ok(rows) = count("SELECT count(*) FROM dlock_fences").await {
        values.insert("fence_rows".into(), rows);
    }
    if let Ok(rows) = count("SELECT count(*) FROM dlock_holders").await {
        values.insert("holder_rows".into(), rows);
    }
    Ok(())
}

async fn read_mysql(
    c: &mut mysql_async::Conn,
    values: &mut BTreeMap<String, f64>,
) -> Result<(), String> {
    use mysql_async::prelude::Queryable;
    let e = |e: mysql_async::Error| format!("mysql probe: {e}");
    let processes: Option<i64> = c
        .query_first("SELECT COUNT(*) FROM information_schema.PROCESSLIST")
        .await
        .map_err(e)?;
    values.insert("processlist".into(), processes.unwrap_or(0) as f64);
    let status: Vec<(String, String)> = c
        .query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN \
             ('Aborted_connects', 'Aborted_clients', 'Threads_connected')",
        )
        .await
        .map_err(e)?;
    for (name, value) in status {
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let metric = match name.as_str() {
            "Aborted_connects" => "aborted_connects_total",
            "Aborted_clients" => "aborted_clients_total",
            _ => "threads_connected",
        };
        values.insert(metric.into(), v);
    }
    // the table exists once dlock has connected to this database
    if let Ok(rows) = c
        .query_first::<i64, _>("SELECT COUNT(*) FROM dlock_fences")
        .await
    {
        values.insert("fence_rows".into(), rows.unwrap_or(0) as f64);
    }
    Ok(())
}

async fn read_etcd(
    c: &mut etcd_client::Client,
    prefix: &str,
    values: &mut BTreeMap<String, f64>,
) -> Result<(), String> {
    let e = |e: etcd_client::Error| format!("etcd probe: {e}");
    let status = c.status().await.map_err(e)?;
    if let Some(header) = status.header() {
        values.insert("revision".into(), header.revision() as f64);
    }
    values.insert("db_size_mb".into(), status.db_size() as f64 / 1_048_576.0);
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let keys = c.get(prefix, Some(options)).await.map_err(e)?;
    values.insert("keys".into(), keys.count() as f64);
    let leases = c.leases().await.map_err(e)?;
    values.insert("leases".into(), leases.leases().len() as f64);
    Ok(())
}
