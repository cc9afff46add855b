//! PgBouncer for the tests: one pooler on a free loopback port in front of
//! a [`PgServer`], with the `pool_mode` the test asks for and
//! `default_pool_size = 2` (or the size asked for). `auth_type = any` logs every client in as the
//! database line's `user=postgres` (a test rig only). PgBouncer refuses to
//! run as root, so when the tests run as root it runs as the `postgres`
//! system user, like the server. Readiness is `psql -c 'SELECT 1'` through
//! it answering. Stopped on drop.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Context, HarnessError, HarnessResult};
use crate::servers::control::ServerControl;
use crate::servers::ports::{free_port, retry_port_clash};
use crate::servers::postgres::PgServer;
use crate::servers::process::{require_binary, run_command, ServerProcess};
use crate::servers::system_user::{self, give, spec_as, wait_answering};

/// The Debian package that provides `pgbouncer`.
pub const PGBOUNCER_PACKAGE: &str = "pgbouncer";
/// Upper bound for PgBouncer to answer.
const READY_LIMIT: Duration = Duration::from_secs(20);
/// Upper bound for one `psql` run.
const PSQL_LIMIT: Duration = Duration::from_secs(20);

/// One PgBouncer on 127.0.0.1, stopped on drop.
#[derive(Debug)]
pub struct PgBouncer {
    // Field order matters: the process must stop before the temp dir is removed.
    process: ServerProcess,
    port: u16,
    psql: PathBuf,
    dir: TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in front of `server` with `pool_mode`
    /// (`session`, `transaction` or `statement`); panics with a readable
    /// message (naming `apt-get install pgbouncer`) when it cannot.
    #[track_caller]
    pub fn start(server: &PgServer, pool_mode: &str) -> Self {
        Self::start_with_pool(server, pool_mode, 2)
    }

    /// [`start`](Self::start) with `default_pool_size = pool_size` (session
    /// mode pins one server session per client connection, and a dlock
    /// backend opens several).
    #[track_caller]
    pub fn start_with_pool(server: &PgServer, pool_mode: &str, pool_size: u32) -> Self {
        Self::start_with_settings(server, pool_mode, pool_size, "")
    }

    /// [`start_with_pool`](Self::start_with_pool) with `extra` lines added
    /// to the `[pgbouncer]` section (e.g. `server_round_robin = 1\n`).
    #[track_caller]
    pub fn start_with_settings(
        server: &PgServer,
        pool_mode: &str,
        pool_size: u32,
        extra: &str,
    ) -> Self {
        retry_port_clash(|| Self::try_start_once(server, pool_mode, pool_size, extra))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start_once(
        server: &PgServer,
        pool_mode: &str,
        pool_size: u32,
        extra: &str,
    ) -> HarnessResult<Self> {
        let bin = require_binary("pgbouncer", PGBOUNCER_PACKAGE).or_else(|_| {
            crate::servers::process::require_file(
                std::path::Path::new("/usr/sbin/pgbouncer"),
                PGBOUNCER_PACKAGE,
            )
        })?;
        let user = system_user::server_user("postgres", "PgBouncer", PGBOUNCER_PACKAGE)?;
        let port = free_port()?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-pgbouncer-{port}-"))
            .tempdir()
            .context(|| "create temp dir for PgBouncer".to_string())?;
        let ini = dir.path().join("pgbouncer.ini");
        let log = dir.path().join("pgbouncer.log");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 postgres = host=127.0.0.1 port={upstream} dbname=postgres user=postgres\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = any\n\
                 pool_mode = {pool_mode}\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 200\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\n\
                 {extra}",
                upstream = server.port(),
                log = log.display(),
            ),
        )
        .context(|| format!("write {}", ini.display()))?;
        give(dir.path(), user)?;
        let spec = spec_as(
            user,
            format!("pgbouncer 127.0.0.1:{port}"),
            &bin,
            dir.path().join("pgbouncer.out"),
        )?
        .arg(&ini);
        let process = ServerProcess::spawn(spec)?;
        let mut pooler = PgBouncer {
            process,
            port,
            psql: server.psql_path().to_path_buf(),
            dir,
        };
        pooler.wait_ready()?;
        Ok(pooler)
    }

    /// The port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The dlock URL through the pooler:
    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// PgBouncer's log, for a failed test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    fn psql_args(&self) -> Vec<String> {
        let port = self.port.to_string();
        [
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-XAtq",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Runs `sql` with psql through the pooler; its output.
    pub fn try_psql(&self, sql: &str) -> HarnessResult<String> {
        let mut args: Vec<OsString> = self.psql_args().into_iter().map(OsString::from).collect();
        args.extend(["-v", "ON_ERROR_STOP=1", "-c", sql].map(OsString::from));
        let out = run_command(&self.psql, &args, &[], PSQL_LIMIT)?;
        if out.success() {
            Ok(out.stdout.trim().to_owned())
        } else {
            Err(HarnessError::new(format!(
                "psql -c {sql:?} through PgBouncer failed: {}{}",
                out.stdout, out.stderr
            )))
        }
    }
}

impl ServerControl for PgBouncer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    fn wait_ready(&mut self) -> HarnessResult<()> {
        let mut args = self.psql_args();
        args.extend(["-c".to_owned(), "SELECT 1".to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let psql = self.psql.clone();
        wait_answering(
            &mut self.process,
            "answering psql",
            READY_LIMIT,
            &psql,
            &args,
        )
    }
}
