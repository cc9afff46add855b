//! PostgreSQL for the tests: one server on a free loopback port, its data
//! directory copied from one `initdb` template kept in `$TMPDIR` (initdb
//! takes about 1.5 s; a copy a few ms), `fsync=off`, trust authentication, the
//! superuser `postgres`. PostgreSQL refuses to run as root, so when the
//! tests run as root, `initdb` and `postgres` run as the `postgres` system
//! user (which the Debian package creates), in directories that user owns.
//! Readiness is `psql -c 'SELECT 1'` answering. Stopped on drop.
//!
//! [`PgServer::start_tls`] and [`PgServer::start_tls_with`] start it with
//! TLS on (`ssl=on`, plain connections still accepted unless the test's
//! `pg_hba.conf` says otherwise): the server's certificate and key, and
//! the CA that client certificates are checked against, copied into the
//! server's directory, the key owned by the server's user, mode 0600.

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

/// Debian packages that provide the server and `psql`.
pub const POSTGRES_PACKAGES: &str = "postgresql postgresql-client";
/// Upper bound for the server to answer.
pub const POSTGRES_READY_LIMIT: Duration = Duration::from_secs(30);
/// Upper bound for one `psql` run.
const PSQL_LIMIT: Duration = Duration::from_secs(20);
/// Upper bound for `initdb`.
const INITDB_LIMIT: Duration = Duration::from_secs(120);

/// One PostgreSQL server on 127.0.0.1, stopped on drop.
#[derive(Debug)]
pub struct PgServer {
    // Field order matters: the process must stop before the temp dir is removed.
    process: ServerProcess,
    port: u16,
    psql: PathBuf,
    /// The TLS material of a TLS server (the client side's paths).
    certs: Option<TestCerts>,
    dir: TempDir,
    /// The postmaster's children stopped by [`PgServer::try_pause_all`], to be
    /// continued by [`PgServer::try_resume_all`] (or on drop).
    paused_children: Vec<u32>,
}

/// Whether a server starts with TLS, and with which certificates.
enum Tls<'a> {
    Off,
    /// Fresh certificates, in the server's directory.
    Fresh,
    Given(&'a TestCerts),
}

/// The directory of the newest installed PostgreSQL's binaries
/// (`/usr/lib/postgresql/<version>/bin` on Debian), or `pg_config --bindir`'s.
fn bindir() -> HarnessResult<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Ok(bin);
    }
    require_binary("postgres", POSTGRES_PACKAGES)
        .map(|p| p.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// The uid and gid of the `postgres` user when this process is root (it
/// must not run the server), else `None` (run as ourselves).
fn server_user() -> HarnessResult<ServerUser> {
    system_user::server_user("postgres", "PostgreSQL", POSTGRES_PACKAGES)
}

/// The `initdb` every server copies: made once per machine, user and
/// PostgreSQL version at `$TMPDIR/dlock-pg-template-<version>-<uid>` (about
/// 40 MB, kept as a cache: a static is never dropped, so a per-process
/// template would be left behind by every test process), and reused while
/// its `PG_VERSION` is there. A process that loses the race to create it
/// uses the winner's and removes its own.
fn template() -> HarnessResult<&'static Path> {
    static TEMPLATE: Template = Template::new();
    TEMPLATE.get(make_template)
}

fn make_template() -> HarnessResult<PathBuf> {
    let bin = bindir()?;
    let version = bin
        .parent()
        .and_then(Path::file_name)
        .and_then(|v| v.to_str())
        .unwrap_or("pg")
        .to_owned();
    let me = my_uid()?;
    Install {
        fixed: std::env::temp_dir().join(format!("dlock-pg-template-{version}-{me}")),
        marker: "PG_VERSION",
        prefix: "dlock-pg-initdb-",
        installer: "initdb",
        template: "the initdb template",
        limit: INITDB_LIMIT,
        user: server_user()?,
    }
    .run(|_, data| {
        let mut initdb = std::process::Command::new(bin.join("initdb"));
        initdb
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(data);
        initdb
    })
}

/// Copies the server's certificate, key and the CA of `certs` into
/// `<dir>/server-tls` (the key mode 0600: PostgreSQL refuses a key others
/// may read; `give` then hands them to the server's user), and returns the
/// server settings that use them.
fn server_tls_files(certs: &TestCerts, dir: &Path) -> HarnessResult<Vec<String>> {
    use std::os::unix::fs::PermissionsExt;
    let at = dir.join("server-tls");
    std::fs::create_dir(&at).context(|| format!("create {}", at.display()))?;
    let (cert, key, ca) = (
        at.join("server.crt"),
        at.join("server.key"),
        at.join("ca.crt"),
    );
    for (from, to) in [
        (certs.server_cert_path(), &cert),
        (certs.server_key_path(), &key),
        (certs.ca_cert_path(), &ca),
    ] {
        std::fs::copy(from, to).context(|| format!("copy {}", from.display()))?;
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
        .context(|| format!("chmod {}", key.display()))?;
    Ok(vec![
        "ssl=on".to_owned(),
        format!("ssl_cert_file={}", cert.display()),
        format!("ssl_key_file={}", key.display()),
        format!("ssl_ca_file={}", ca.display()),
    ])
}

impl PgServer {
    /// Starts a server. Panics with the harness error (e.g. how to install
    /// PostgreSQL) if it cannot.
    #[track_caller]
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`PgServer::start`].
    pub fn try_start() -> HarnessResult<Self> {
        retry_port_clash(|| Self::try_start_once(Tls::Off, &[]))
    }

    /// Starts a server with extra `name=value` settings (each passed as
    /// `-c`, after the harness's own, so they win: e.g.
    /// `max_connections=20`). Panics if it cannot.
    #[track_caller]
    pub fn start_with_settings(settings: &[&str]) -> Self {
        retry_port_clash(|| Self::try_start_once(Tls::Off, settings))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server with TLS on, its certificate from fresh
    /// [`TestCerts`] (see [`PgServer::certs`]). Panics if it cannot.
    #[track_caller]
    pub fn start_tls() -> Self {
        retry_port_clash(|| Self::try_start_once(Tls::Fresh, &[])).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server with TLS on and `certs`' server certificate (e.g.
    /// one for another host name). Panics if it cannot.
    #[track_caller]
    pub fn start_tls_with(certs: &TestCerts) -> Self {
        retry_port_clash(|| Self::try_start_once(Tls::Given(certs), &[]))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start_once(tls: Tls<'_>, settings: &[&str]) -> HarnessResult<Self> {
        let bin = bindir()?;
        let psql = require_binary("psql", POSTGRES_PACKAGES)?;
        let user = server_user()?;
        let template = template()?;
        let port = free_port()?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-pg-{port}-"))
            .tempdir()
            .context(|| "create temp dir for PostgreSQL".to_string())?;
        let data = dir.path().join("data");
        copy_dir(template, &data, FileCopy::Plain)?;
        std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .context(|| format!("chmod {}", data.display()))?;
        let certs = match tls {
            Tls::Off => None,
            Tls::Fresh => {
                let at = dir.path().join("certs");
                std::fs::create_dir(&at).context(|| format!("create {}", at.display()))?;
                Some(TestCerts::generate(&at)?)
            }
            Tls::Given(certs) => Some(certs.clone()),
        };
        let ssl = certs
            .as_ref()
            .map(|c| server_tls_files(c, dir.path()))
            .transpose()?;
        give(dir.path(), user)?;
        let mut spec = spec_as(
            user,
            format!("postgres 127.0.0.1:{port}"),
            &bin.join("postgres"),
            dir.path().join("postgres.log"),
        )?;
        spec = spec
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(port.to_string())
            .arg("-k")
            .arg(dir.path())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ]);
        if let Some(settings) = ssl {
            for setting in settings {
                spec = spec.arg("-c").arg(setting);
            }
        }
        for setting in settings {
            spec = spec.arg("-c").arg(setting);
        }
        let process = ServerProcess::spawn(spec)?;
        let mut server = PgServer {
            process,
            port,
            psql,
            certs,
            dir,
            paused_children: Vec::new(),
        };
        server.wait_ready()?;
        Ok(server)
    }

    single_server_accessors!(port, certs);

    /// The server's log file (its stderr, at the default `log_min_messages`
    /// and `log_min_error_statement`): for tests that count what a client
    /// made the server log.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The dlock URL: `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The dlock URL of a TLS server that checks its certificate fully:
    /// [`url`](Self::url)`?sslmode=verify-full&sslrootcert=<the CA>`.
    /// Panics on a server without TLS.
    #[track_caller]
    pub fn tls_url(&self) -> String {
        let ca = self
            .ca_cert_path()
            .expect("a TLS server (PgServer::start_tls)");
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            self.url(),
            ca.display()
        )
    }

    /// Puts `lines` at the top of `pg_hba.conf` (the first matching line
    /// wins) and has the server reload it. Panics on failure.
    #[track_caller]
    pub fn hba_first(&self, lines: &str) {
        let hba = self.dir.path().join("data").join("pg_hba.conf");
        let rules =
            std::fs::read_to_string(&hba).unwrap_or_else(|e| panic!("read {}: {e}", hba.display()));
        std::fs::write(&hba, format!("{lines}\n{rules}"))
            .unwrap_or_else(|e| panic!("write {}: {e}", hba.display()));
        assert_eq!(self.psql("SELECT pg_reload_conf()"), "t");
        // The postmaster reads it on its SIGHUP, a moment later.
        std::thread::sleep(Duration::from_millis(300));
    }

    /// Runs one SQL command with `psql` as the superuser, returns its
    /// trimmed output (`-XAtq`: unaligned, tuples only). Panics on failure.
    #[track_caller]
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The arguments that connect `psql` to this server as the superuser
    /// (`-h 127.0.0.1 -p PORT -U postgres -d postgres`), quiet and without
    /// `.psqlrc` (`-XAtq`: unaligned, tuples only); a test's own `psql`
    /// adds what it runs.
    pub fn psql_args(&self) -> Vec<String> {
        [
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-XAtq",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Fallible [`PgServer::psql`].
    pub fn try_psql(&self, sql: &str) -> HarnessResult<String> {
        let mut args: Vec<OsString> = self.psql_args().into_iter().map(OsString::from).collect();
        args.extend(["-v", "ON_ERROR_STOP=1", "-c", sql].map(OsString::from));
        let out = run_command(&self.psql, &args, &[], PSQL_LIMIT)?;
        if out.success() {
            Ok(out.stdout.trim().to_owned())
        } else {
            Err(HarnessError::new(format!(
                "psql -c {sql:?} failed: {}{}",
                out.stdout, out.stderr
            )))
        }
    }

    /// The `psql` binary, to run a separate client process.
    pub fn psql_path(&self) -> &Path {
        &self.psql
    }
}

impl PgServer {
    /// Asks the server for a fast shutdown (SIGINT: sessions are ended at
    /// once; SIGTERM's smart shutdown would wait for every client).
    fn shut_down_fast(&mut self) {
        if let Some(pid) = self.process.pid().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGINT,
            );
        }
    }

    /// Restarts the server as a read-only standby (a `standby.signal` in its
    /// data directory and no primary to follow: it stays in recovery and
    /// answers read-only queries). Panics on failure.
    #[track_caller]
    pub fn restart_as_standby(&mut self) {
        let signal = self.dir.path().join("data").join("standby.signal");
        std::fs::write(&signal, "").unwrap_or_else(|e| panic!("write {}: {e}", signal.display()));
        self.fast_restart();
    }

    /// Restarts the server (fast shutdown, then the same command line: same
    /// port, same data) and waits until it answers. Panics on failure.
    #[track_caller]
    pub fn fast_restart(&mut self) {
        self.try_fast_restart().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Fallible [`PgServer::fast_restart`]: every session ends (its advisory
    /// locks with it), logged tables keep their rows (a fast shutdown writes a
    /// checkpoint). Bounded: the stop by [`POSTGRES_READY_LIMIT`], then
    /// SIGKILL; the start by the readiness wait.
    pub fn try_fast_restart(&mut self) -> HarnessResult<()> {
        self.try_resume_all()?;
        self.shut_down_fast();
        let started = std::time::Instant::now();
        while self.process.is_running() {
            if started.elapsed() > POSTGRES_READY_LIMIT {
                // `stop` sends SIGTERM, then SIGKILL after its grace, and reaps
                self.process.stop()?;
                return Err(HarnessError::new(format!(
                    "postgres did not stop within {POSTGRES_READY_LIMIT:?} of SIGINT; log {}:\n{}",
                    self.process.log_path().display(),
                    self.process.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.process.start()?;
        self.wait_ready()
    }

    /// Freezes the whole server with SIGSTOP: the postmaster first (so that it
    /// forks no new backend), then each of its children — the client backends
    /// holding the sessions, and the background processes — and waits (up to
    /// 2 s) until each is stopped. Stopping the postmaster alone would freeze
    /// no session: each backend is a process of its own.
    pub fn try_pause_all(&mut self) -> HarnessResult<()> {
        let postmaster = self
            .process
            .pid()
            .ok_or_else(|| HarnessError::new(format!("{} is not running", self.process.name())))?;
        self.process.pause()?;
        let children = children_of(postmaster);
        for &child in &children {
            // a child that exited meanwhile has nothing to freeze
            let _ = signal(child, nix::sys::signal::Signal::SIGSTOP);
        }
        self.paused_children = children;
        let started = std::time::Instant::now();
        while !self.paused_children.iter().all(|&pid| stopped_or_gone(pid)) {
            if started.elapsed() > Duration::from_secs(2) {
                return Err(HarnessError::new(format!(
                    "the backends of {} did not stop within 2 s of SIGSTOP",
                    self.process.name()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Lets a server frozen by [`PgServer::try_pause_all`] go on: its children
    /// first, then the postmaster. Does nothing if it is not paused.
    pub fn try_resume_all(&mut self) -> HarnessResult<()> {
        for pid in std::mem::take(&mut self.paused_children) {
            let _ = signal(pid, nix::sys::signal::Signal::SIGCONT);
        }
        if self.process.is_paused() {
            self.process.resume()?;
        }
        Ok(())
    }
}

/// Sends `sig` to `pid`.
fn signal(pid: u32, sig: nix::sys::signal::Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::errno::Errno::ESRCH)?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
}

/// The pids whose parent is `parent` (from `/proc/*/stat`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            proc_stat(pid)
                .and_then(|fields| fields.get(1)?.parse::<u32>().ok())
                .is_some_and(|ppid| ppid == parent)
        })
        .collect()
}

/// The fields of `/proc/PID/stat` after the command name: state, ppid, …
fn proc_stat(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `PID (COMM) STATE PPID ...`; COMM may contain spaces and parentheses.
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// Whether `pid` is stopped (state `T`), or gone (or a zombie: it runs no more).
fn stopped_or_gone(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|f| matches!(f.first().map(String::as_str), Some("T" | "t" | "Z")))
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // A frozen server would not shut down: continue it first. Then the
        // process's own drop waits for it to exit.
        let _ = self.try_resume_all();
        self.shut_down_fast();
    }
}

impl ServerControl for PgServer {
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
        wait_answering(
            &mut self.process,
            "answering psql",
            POSTGRES_READY_LIMIT,
            &self.psql,
            &args,
        )
    }
}
