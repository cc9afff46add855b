//! MariaDB for the tests: one server on a free loopback port, its data
//! directory copied from one `mariadb-install-db` template kept in
//! `$TMPDIR` (the install takes about half a second; a copy a few ms, holes
//! kept), small InnoDB files and buffer pool, the superuser `root` without
//! a password over TCP, and a database `dlock`. MariaDB refuses to run as
//! root, so when the tests run as root, `mariadb-install-db` and `mariadbd`
//! run as the `mysql` system user (which the Debian package creates), in
//! directories that user owns. Readiness is `mariadb -e 'SELECT 1'`
//! answering. Stopped on drop. [`MariaDbServer::start_tls`] starts one
//! with TLS (`--ssl-cert`, `--ssl-key`, `--ssl-ca` from a fresh
//! [`TestCerts`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Context, HarnessError, HarnessResult};
use crate::servers::accessors::single_server_accessors;
use crate::servers::control::ServerControl;
use crate::servers::ports::{free_port, retry_port_clash};
use crate::servers::process::{require_binary, run_command, ServerProcess};
use crate::servers::system_user::{
    self, copy_dir, give, my_uid, spec_as, wait_answering, FileCopy, Install, ServerUser, Template,
};
use crate::tls::TestCerts;

/// Debian packages that provide the server and the `mariadb` client.
pub const MARIADB_PACKAGES: &str = "mariadb-server mariadb-client";
/// Upper bound for the server to answer.
pub const MARIADB_READY_LIMIT: Duration = Duration::from_secs(30);
/// Upper bound for one `mariadb` client run.
const CLIENT_LIMIT: Duration = Duration::from_secs(20);
/// Upper bound for `mariadb-install-db`.
const INSTALL_LIMIT: Duration = Duration::from_secs(120);
/// The database the harness creates for dlock.
pub const DATABASE: &str = "dlock";

/// InnoDB settings of the install and of every start: small files, a small
/// buffer pool (many servers run at once), no durability wait.
const INNODB: [&str; 5] = [
    "--innodb-log-file-size=4M",
    "--innodb-data-file-path=ibdata1:4M:autoextend",
    "--innodb-buffer-pool-size=16M",
    "--innodb-temp-data-file-path=ibtmp1:4M:autoextend",
    "--innodb-flush-log-at-trx-commit=2",
];

/// One MariaDB server on 127.0.0.1, stopped on drop.
#[derive(Debug)]
pub struct MariaDbServer {
    // Field order matters: the process must stop before the temp dir is removed.
    process: ServerProcess,
    port: u16,
    client: PathBuf,
    /// The TLS files of a server started with TLS.
    certs: Option<TestCerts>,
    dir: TempDir,
}

/// The uid and gid of the `mysql` user when this process is root (it must
/// not run the server), else `None` (run as ourselves).
fn server_user() -> HarnessResult<ServerUser> {
    system_user::server_user("mysql", "MariaDB", MARIADB_PACKAGES)
}

/// The `mariadbd` binary (in `/usr/sbin` on Debian, which a user's `PATH`
/// may lack).
fn server_binary() -> HarnessResult<PathBuf> {
    let sbin = Path::new("/usr/sbin/mariadbd");
    if sbin.is_file() {
        return Ok(sbin.to_path_buf());
    }
    require_binary("mariadbd", MARIADB_PACKAGES)
}

/// The installed data directory every server copies: made once per
/// machine and user at `$TMPDIR/dlock-mariadb-template-<uid>` (kept as a
/// cache, as PostgreSQL's is), reused while its `mysql` directory is there.
/// A process that loses the race to create it uses the winner's.
fn template() -> HarnessResult<&'static Path> {
    static TEMPLATE: Template = Template::new();
    TEMPLATE.get(make_template)
}

fn make_template() -> HarnessResult<PathBuf> {
    server_binary()?;
    let install = require_binary("mariadb-install-db", MARIADB_PACKAGES)?;
    let me = my_uid()?;
    Install {
        fixed: std::env::temp_dir().join(format!("dlock-mariadb-template-{me}")),
        marker: "mysql",
        prefix: "dlock-mariadb-install-",
        installer: "mariadb-install-db",
        template: "the MariaDB template",
        limit: INSTALL_LIMIT,
        user: server_user()?,
    }
    .run(|dir, data| {
        let mut command = std::process::Command::new(&install);
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .args(INNODB)
            // A temp dir of its own: installs racing in one fresh `$TMPDIR`
            // (the first run of a suite's processes) failed on each other's
            // temporary tables ("Could not remove temporary table").
            .env("TMPDIR", dir);
        command
    })
}

impl MariaDbServer {
    /// Starts a server. Panics with the harness error (e.g. how to install
    /// MariaDB) if it cannot.
    #[track_caller]
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`MariaDbServer::start`].
    pub fn try_start() -> HarnessResult<Self> {
        retry_port_clash(|| Self::try_start_once(None))
    }

    /// Starts a server with TLS on (`--ssl-cert`, `--ssl-key`, `--ssl-ca`
    /// of a fresh [`TestCerts`], valid for 127.0.0.1 and localhost); plain
    /// connections are still accepted. Panics if it cannot.
    #[track_caller]
    pub fn start_tls() -> Self {
        retry_port_clash(|| Self::try_start_once(Some(None))).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`MariaDbServer::start_tls`], but the server's certificate names
    /// only the host `dns_name` (no address): a client checking the host
    /// name of `127.0.0.1` must refuse it.
    #[track_caller]
    pub fn start_tls_for_host(dns_name: &str) -> Self {
        retry_port_clash(|| Self::try_start_once(Some(Some(dns_name))))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `tls`: `None` plain; `Some(None)` TLS with a certificate for
    /// 127.0.0.1 and localhost; `Some(Some(host))` for `host` only.
    fn try_start_once(tls: Option<Option<&str>>) -> HarnessResult<Self> {
        let bin = server_binary()?;
        let client = require_binary("mariadb", MARIADB_PACKAGES)?;
        let user = server_user()?;
        let template = template()?;
        let port = free_port()?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-mariadb-{port}-"))
            .tempdir()
            .context(|| "create temp dir for MariaDB".to_string())?;
        let data = dir.path().join("data");
        copy_dir(template, &data, FileCopy::Sparse)?;
        let certs = match tls {
            None => None,
            Some(host) => {
                let at = dir.path().join("certs");
                std::fs::create_dir_all(&at).context(|| format!("create {}", at.display()))?;
                Some(match host {
                    None => TestCerts::generate(&at)?,
                    Some(host) => TestCerts::generate_for_host(&at, host)?,
                })
            }
        };
        // The server's own temporary files (the implicit temporary tables of
        // a PROCESSLIST query) in its directory, not the shared /tmp: a
        // test that cleans /tmp once made a PROCESSLIST query fail with
        // "Error on delete of '/tmp/#sql-temptable-…'".
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).context(|| format!("create {}", tmp.display()))?;
        give(dir.path(), user)?;
        let mut spec = spec_as(
            user,
            format!("mariadbd 127.0.0.1:{port}"),
            &bin,
            dir.path().join("mariadb.log"),
        )?;
        spec = spec
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--skip-log-bin", "--max-connections=500"])
            .args(INNODB);
        if let Some(certs) = &certs {
            spec = spec
                .arg(format!("--ssl-cert={}", certs.server_cert_path().display()))
                .arg(format!("--ssl-key={}", certs.server_key_path().display()))
                .arg(format!("--ssl-ca={}", certs.ca_cert_path().display()));
        }
        let process = ServerProcess::spawn(spec)?;
        let mut server = MariaDbServer {
            process,
            port,
            client,
            certs,
            dir,
        };
        server.wait_ready()?;
        server.try_sql(&format!("CREATE DATABASE IF NOT EXISTS {DATABASE}"))?;
        Ok(server)
    }

    single_server_accessors!(port, certs);

    /// The dlock URL over TLS with the host name and chain checked against
    /// the test CA: `mysqls://root@127.0.0.1:PORT/dlock?ssl-ca=<ca.crt>`.
    /// Panics for a server started without TLS.
    pub fn tls_url(&self) -> String {
        let ca = self
            .ca_cert_path()
            .expect("a TLS server (MariaDbServer::start_tls)");
        format!(
            "mysqls://root@127.0.0.1:{}/{DATABASE}?ssl-ca={}",
            self.port,
            ca.display()
        )
    }

    /// The dlock URL: `mysql://root@127.0.0.1:PORT/dlock`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// The dlock URL of `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "mysql://{user}:{password}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    /// Runs SQL with the `mariadb` client as root in the `dlock` database,
    /// returns its trimmed output (tab-separated, no column names). Panics
    /// on failure.
    #[track_caller]
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`MariaDbServer::sql`].
    pub fn try_sql(&self, sql: &str) -> HarnessResult<String> {
        self.try_sql_as("root", "", sql)
    }

    /// Runs SQL as `user` (with `password`; empty: none).
    pub fn try_sql_as(&self, user: &str, password: &str, sql: &str) -> HarnessResult<String> {
        let mut args: Vec<OsString> = vec![
            "--no-defaults".into(),
            "-h127.0.0.1".into(),
            format!("-P{}", self.port).into(),
            format!("-u{user}").into(),
            "-N".into(),
            "-B".into(),
        ];
        if !password.is_empty() {
            args.push(format!("-p{password}").into());
        }
        args.push("-e".into());
        args.push(sql.into());
        if !sql.starts_with("CREATE DATABASE") {
            args.push(DATABASE.into());
        }
        let out = run_command(&self.client, &args, &[], CLIENT_LIMIT)?;
        if out.success() {
            Ok(out.stdout.trim().to_owned())
        } else {
            Err(HarnessError::new(format!(
                "mariadb -e {sql:?} failed: {}{}",
                out.stdout, out.stderr
            )))
        }
    }

    /// The `mariadb` client binary, to run a separate client process.
    pub fn client_path(&self) -> &Path {
        &self.client
    }
}

impl ServerControl for MariaDbServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    fn wait_ready(&mut self) -> HarnessResult<()> {
        let port = format!("-P{}", self.port);
        wait_answering(
            &mut self.process,
            "answering the mariadb client",
            MARIADB_READY_LIMIT,
            &self.client,
            &[
                "--no-defaults",
                "-h127.0.0.1",
                &port,
                "-uroot",
                "-e",
                "SELECT 1",
            ],
        )
    }
}
