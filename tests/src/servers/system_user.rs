//! A database server run as its own system user, from a template data
//! directory: what the MariaDB and PostgreSQL harnesses share.
//!
//! Both servers refuse to run as root, so when the tests run as root the
//! install (`mariadb-install-db`, `initdb`) and the server run as the
//! system user the Debian package creates (`mysql`, `postgres`), in
//! directories handed to that user. The install is slow (0.5–1.5 s), so it
//! is made once per machine and user into a fixed directory under
//! `$TMPDIR` (kept as a cache: a static is never dropped, so a per-process
//! template would be left behind by every test process) and each server
//! copies it.

use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Context, HarnessError, HarnessResult};
use crate::servers::process::{require_binary, run_command, ProcessSpec, ServerProcess};

/// The uid and gid a server runs as, `None`: as this process.
pub(crate) type ServerUser = Option<(u32, u32)>;

/// The uid of this process.
pub(crate) fn my_uid() -> HarnessResult<u32> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/self")
        .context(|| "read /proc/self".to_string())?
        .uid())
}

/// The uid and gid of the system user `user` when this process is root
/// (`server`, e.g. "MariaDB", must not run as root), else `None` (run as
/// ourselves). Without that user, the error names `packages` to install.
pub(crate) fn server_user(user: &str, server: &str, packages: &str) -> HarnessResult<ServerUser> {
    if my_uid()? != 0 {
        return Ok(None);
    }
    let passwd =
        std::fs::read_to_string("/etc/passwd").context(|| "read /etc/passwd".to_string())?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&user) && f.len() > 3)
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .map(Some)
        .ok_or_else(|| {
            HarnessError::new(format!(
                "the tests run as root and {server} refuses to: there is no `{user}` user to run it as; run `sudo apt-get install {packages}` (which creates it) or `scripts/install-deps.sh`"
            ))
        })
}

/// Hands `path` (recursively) to `user`.
pub(crate) fn give(path: &Path, user: ServerUser) -> HarnessResult<()> {
    let Some((uid, gid)) = user else {
        return Ok(());
    };
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .context(|| format!("chown {}", path.display()))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path).context(|| format!("read {}", path.display()))? {
            let entry = entry.context(|| format!("read {}", path.display()))?;
            give(&entry.path(), user)?;
        }
    }
    Ok(())
}

/// The process spec of a server binary `bin` run as `user`: as root,
/// `setpriv` drops to that user and execs the server in place, so the
/// process signalled (stop, pause) is the server itself.
pub(crate) fn spec_as(
    user: ServerUser,
    name: String,
    bin: &Path,
    log: PathBuf,
) -> HarnessResult<ProcessSpec> {
    Ok(match user {
        Some((uid, gid)) => ProcessSpec::new(name, require_binary("setpriv", "util-linux")?, log)
            .args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".to_owned(),
                "--".to_owned(),
            ])
            .arg(bin),
        None => ProcessSpec::new(name, bin, log),
    })
}

/// A template data directory made once per process (the first caller's
/// result, error included, is every caller's).
pub(crate) struct Template(OnceLock<Result<PathBuf, String>>);

impl Template {
    pub(crate) const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The template's data directory, made by `make` on the first call.
    pub(crate) fn get(
        &'static self,
        make: impl FnOnce() -> HarnessResult<PathBuf>,
    ) -> HarnessResult<&'static Path> {
        match self.0.get_or_init(|| make().map_err(|e| e.to_string())) {
            Ok(data) => Ok(data.as_path()),
            Err(e) => Err(HarnessError::new(e.clone())),
        }
    }
}

/// How to make a template data directory.
pub(crate) struct Install<'a> {
    /// Where it is kept: its `data` below it is the template.
    pub fixed: PathBuf,
    /// A path below `data` that a finished install has.
    pub marker: &'a str,
    /// The prefix of the temp dir it is made in.
    pub prefix: &'a str,
    /// The installer's name in messages (`initdb`).
    pub installer: &'a str,
    /// What the template is called in messages (`the initdb template`).
    pub template: &'a str,
    pub limit: Duration,
    pub user: ServerUser,
}

impl Install<'_> {
    /// `fixed/data` if a finished install is there, else runs the command
    /// `command(temp dir, data dir)` (as the server's user, bounded by
    /// `limit`) and moves its temp dir to `fixed`. A rename onto an
    /// existing, non-empty directory fails: then another process made it
    /// first, its template is used and ours (dropped) is removed.
    pub(crate) fn run(
        self,
        command: impl FnOnce(&Path, &Path) -> Command,
    ) -> HarnessResult<PathBuf> {
        let installed = |at: &Path| at.join("data").join(self.marker).exists();
        if installed(&self.fixed) {
            return Ok(self.fixed.join("data"));
        }
        let dir = tempfile::Builder::new()
            .prefix(self.prefix)
            .tempdir()
            .context(|| format!("create temp dir for {}", self.installer))?;
        give(dir.path(), self.user)?;
        let mut command = command(dir.path(), &dir.path().join("data"));
        command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some((uid, gid)) = self.user {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid);
        }
        let child = command
            .spawn()
            .context(|| format!("run {}", command.get_program().to_string_lossy()))?;
        let out = wait_bounded(child, self.limit, self.installer)?;
        if !out.status.success() {
            return Err(HarnessError::new(format!(
                "{} failed: {}{}",
                self.installer,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        if std::fs::rename(dir.path(), &self.fixed).is_ok() {
            std::mem::forget(dir);
        } else if !installed(&self.fixed) {
            return Err(HarnessError::new(format!(
                "could not move {} to {}",
                self.template,
                self.fixed.display()
            )));
        }
        Ok(self.fixed.join("data"))
    }
}

/// Waits for `child` (named `what` in messages) at most `limit`, killing
/// it after.
fn wait_bounded(
    mut child: std::process::Child,
    limit: Duration,
    what: &str,
) -> HarnessResult<std::process::Output> {
    let started = std::time::Instant::now();
    loop {
        if child
            .try_wait()
            .context(|| format!("wait for {what}"))?
            .is_some()
        {
            return child
                .wait_with_output()
                .context(|| format!("read {what} output"));
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HarnessError::new(format!(
                "{what} did not finish within {limit:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How [`copy_dir`] copies one file.
#[derive(Clone, Copy)]
pub(crate) enum FileCopy {
    /// `std::fs::copy` (mode kept).
    Plain,
    /// Blocks of zeros left as holes (InnoDB's system file is mostly
    /// zeros: each server's copy stays small).
    Sparse,
}

/// Copies the directory `from` into `to` (files and directories only).
pub(crate) fn copy_dir(from: &Path, to: &Path, how: FileCopy) -> HarnessResult<()> {
    std::fs::create_dir_all(to).context(|| format!("create {}", to.display()))?;
    for entry in std::fs::read_dir(from).context(|| format!("read {}", from.display()))? {
        let entry = entry.context(|| format!("read {}", from.display()))?;
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target, how)?;
        } else {
            match how {
                FileCopy::Plain => std::fs::copy(entry.path(), &target).map(drop),
                FileCopy::Sparse => sparse_copy(&entry.path(), &target),
            }
            .context(|| format!("copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

fn sparse_copy(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut source = std::fs::File::open(from)?;
    let mut target = std::fs::File::create(to)?;
    let mut block = vec![0u8; 64 * 1024];
    let mut length = 0u64;
    loop {
        let n = source.read(&mut block)?;
        if n == 0 {
            break;
        }
        if block[..n].iter().all(|&b| b == 0) {
            target.seek(SeekFrom::Current(n as i64))?;
        } else {
            target.write_all(&block[..n])?;
        }
        length += n as u64;
    }
    target.set_len(length)
}

/// Waits (up to `limit`) until the server's command-line `client`, run
/// with `args` (each run bounded by 3 s), succeeds: its readiness.
pub(crate) fn wait_answering(
    process: &mut ServerProcess,
    what: &str,
    limit: Duration,
    client: &Path,
    args: &[&str],
) -> HarnessResult<()> {
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    process.wait_until(what, limit, || {
        run_command(client, &args, &[], Duration::from_secs(3)).is_ok_and(|out| out.success())
    })
}
