//! The URL: `file:///absolute/dir[?prefix=…&client_name=…&mode=0600&shared_dir=accept]`.
//!
//! The directory must be absolute (`file://` then the path: three slashes;
//! `file://localhost/…` is the same), exist, be a directory this process
//! may write, and sit on a local file system (`fs_kind.rs`). Its path is
//! percent-decoded (`%20` for a space, `%3F` for a `?`).

use std::path::PathBuf;

use crate::url::options::{unknown, FILE};
use crate::LockError;

/// The backend's settings, read from its URL.
#[derive(Debug, Clone)]
pub(super) struct Config {
    /// The directory of the lock files, absolute.
    pub(super) dir: PathBuf,
    /// `?prefix=` (default `dlock`): the first part of every file name.
    pub(super) prefix: String,
    /// `?client_name=`, or this process's default.
    pub(super) client_name: Option<String>,
    /// `?mode=` (default `0600`): the permission bits of the files dlock
    /// creates.
    pub(super) mode: u32,
    /// `?shared_dir=accept`: use a directory every user may write (such
    /// as `/tmp`), which `connect` otherwise refuses.
    pub(super) shared_dir: bool,
    /// The URL for errors and `describe()`.
    pub(super) shown: String,
}

/// The default `?prefix=`.
const DEFAULT_PREFIX: &str = "dlock";
/// The default `?mode=`: the owner reads and writes, nobody else.
pub(super) const DEFAULT_MODE: u32 = 0o600;

/// Reads a `file://` URL (no file system access: `connect` checks the
/// directory).
pub(super) fn parse(url: &str) -> Result<Config, LockError> {
    let shown = crate::url::redact(url);
    let bad = |why: String| LockError::invalid_option(format!("`{shown}`: {why}"));
    let Some(rest) = url.strip_prefix("file://") else {
        return Err(bad(
            "not a file URL; write `file:///absolute/path/to/dir`".into()
        ));
    };
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = match path.strip_prefix("localhost") {
        Some(after) if after.starts_with('/') => after,
        _ => path,
    };
    if !path.starts_with('/') {
        // (The text is not quoted apart: a mistyped server URL may hold a
        // password there; `shown` is redacted.)
        return Err(bad(
            "a file URL names an absolute directory, and this one does not start with `/`: write `file:///absolute/path` (three slashes: no host, then the path), e.g. `file:///var/lock/myapp`".into(),
        ));
    }
    let decoded = crate::url::percent_decode(path).map_err(|e| bad(format!("the path: {e}")))?;
    if decoded.contains('\0') {
        return Err(bad("the path holds a NUL byte".into()));
    }
    if decoded.split('/').any(|part| part == "..") {
        return Err(bad(format!(
            "the path `{decoded}` holds `..`; name the directory itself"
        )));
    }
    let mut config = Config {
        dir: PathBuf::from(decoded),
        prefix: DEFAULT_PREFIX.to_owned(),
        client_name: Some(crate::backend::holder::default_client_name().to_owned()),
        mode: DEFAULT_MODE,
        shared_dir: false,
        shown: shown.clone(),
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "prefix" => config.prefix = crate::url::prefix::parse(value).map_err(bad)?,
            "client_name" => {
                let name = crate::url::percent_decode(value)
                    .map_err(|e| bad(format!("`client_name`: {e}")))?;
                config.client_name = Some(crate::backend::holder::check_client_name(&name)?);
            }
            "mode" => config.mode = mode(value).map_err(bad)?,
            "shared_dir" => match value {
                "accept" => config.shared_dir = true,
                "refuse" => config.shared_dir = false,
                _ => return Err(bad(format!(
                    "`shared_dir={value}`: write `shared_dir=accept` to use a directory every user may write (e.g. /tmp), or leave it out (the default, `refuse`)"
                ))),
            },
            other => return Err(bad(unknown(other, "file", FILE, false))),
        }
    }
    Ok(config)
}

/// `?mode=`: octal permission bits that let the owner read and write (dlock
/// opens its files for both) and set no set-id or sticky bit.
fn mode(value: &str) -> Result<u32, String> {
    let digits = value.strip_prefix("0o").unwrap_or(value);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 && mode & 0o600 == 0o600 => Ok(mode),
        Ok(mode) if mode <= 0o777 => Err(format!(
            "`mode={value}` does not let the owner read and write (0600): dlock opens its files for both; write e.g. `mode=0600` or `mode=0660`"
        )),
        _ => Err(format!(
            "`mode={value}` is not octal permission bits (at most 0777); write e.g. `mode=0600` (the default) or `mode=0660` for a group"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        parse(url).unwrap_err().to_string()
    }

    #[test]
    fn reads_the_directory_and_parameters() {
        let c =
            parse("file:///var/lock/my%20app?prefix=billing&client_name=cron-1&mode=0660").unwrap();
        assert_eq!(c.dir, PathBuf::from("/var/lock/my app"));
        assert_eq!(c.prefix, "billing");
        assert_eq!(c.client_name.as_deref(), Some("cron-1"));
        assert_eq!(c.mode, 0o660);
        let c = parse("file://localhost/tmp").unwrap();
        assert_eq!(
            (c.dir, c.prefix.as_str(), c.mode),
            (PathBuf::from("/tmp"), "dlock", 0o600)
        );
    }

    #[test]
    fn refuses_what_is_not_an_absolute_directory() {
        let e = err("file://tmp/locks");
        assert!(
            e.contains("`file://tmp/locks`") && e.contains("three slashes"),
            "{e}"
        );
        assert!(err("file://").contains("absolute"));
        assert!(err("file:///tmp/../etc").contains("holds `..`"));
        assert!(err("file:///tmp/a%00b").contains("NUL"));
        assert!(err("file:///tmp?prefx=a").contains("did you mean `prefix`?"));
        assert!(err("file:///tmp?sessions=2").contains("PostgreSQL"));
        assert!(err("file:///tmp?prefix=a/b").contains("holds a `/`"));
        assert!(err("file:///tmp?mode=0644x").contains("not octal"));
        assert!(err("file:///tmp?mode=4600").contains("not octal"));
        assert!(err("file:///tmp?mode=0400").contains("read and write"));
        assert!(err("file:///tmp?shared_dir=yes").contains("shared_dir=accept"));
        assert!(parse("file:///tmp?shared_dir=accept").unwrap().shared_dir);
    }
}
