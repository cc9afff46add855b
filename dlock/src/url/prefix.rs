//! The one check of `?prefix=`, the same on every backend.
//!
//! A prefix names a namespace, and each backend derives every name it writes
//! from it: `<prefix>:{<key>}` on Redis, `<prefix>/<key>/…`,
//! `<prefix>-rw/…`, `<prefix>-semaphores/…` and `<prefix>-election/…` on
//! etcd, the same as nodes on ZooKeeper. A prefix is refused when it could
//! spell a name of another namespace:
//! - a `/` would make it a directory inside another prefix's (etcd,
//!   ZooKeeper): `app/x` with key `y` is `app/x/y`, the lock `x/y`… of `app`;
//! - `{` or `}` would move or break Redis Cluster's hash tag (`{x}` puts every
//!   lock in one slot, `{}` or `a{` makes each lock's keys cross slots);
//! - a name that ends like an internal root (`-rw`, `-semaphores`,
//!   `-election`) would be another prefix's read-write locks, semaphores or
//!   elections: `dlock-semaphores` holds the default prefix's semaphores;
//! - `zookeeper` is the server's own node, `.` and `..` are not names.
//!
//! The rest is a short allow-list (ASCII letters, digits, `-`, `_`, `.`,
//! `:`) that every backend stores as it is, so one prefix means the same on
//! all of them.

use super::percent_decode;

/// The longest prefix, in bytes: keys take up to 512, and the names built
/// from both must stay within what every server takes.
const MAX_LEN: usize = 128;

/// The endings of the roots a backend derives from a prefix.
const INTERNAL_ROOTS: [&str; 3] = ["-rw", "-semaphores", "-election"];

/// Decodes and checks a `?prefix=` value. The error names the value and
/// what to write.
pub(crate) fn parse(raw: &str) -> Result<String, String> {
    let prefix = percent_decode(raw).map_err(|e| format!("`prefix={raw}`: {e}"))?;
    check(&prefix).map_err(|why| format!("`prefix={raw}` {why}"))?;
    Ok(prefix)
}

fn check(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err("is empty; give a name, e.g. `prefix=billing`".into());
    }
    if prefix.len() > MAX_LEN {
        return Err(format!("is longer than {MAX_LEN} bytes"));
    }
    if prefix.contains('/') {
        return Err("holds a `/`, which would put it inside another prefix's namespace (`app/x` is the lock `x/…` of `app`); write one name, e.g. `app-x`".into());
    }
    if prefix.contains(['{', '}']) {
        return Err("holds a `{` or `}`, which would move Redis Cluster's hash tag (one slot for every lock, or keys across slots); write one name without braces".into());
    }
    if let Some(root) = INTERNAL_ROOTS.iter().find(|root| prefix.ends_with(*root)) {
        return Err(format!(
            "ends in `{root}`, like the roots dlock keeps beside a prefix (`<prefix>{root}` holds another prefix's {}); choose a name that does not end in -rw, -semaphores or -election",
            match *root {
                "-rw" => "read-write locks",
                "-semaphores" => "semaphores",
                _ => "elections",
            }
        ));
    }
    if prefix == "." || prefix == ".." || prefix == "zookeeper" {
        return Err("is a name the servers keep for themselves (`.`, `..`, ZooKeeper's `zookeeper`); choose another".into());
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(format!(
            "holds {c:?}; a prefix is ASCII letters, digits, `-`, `_`, `.` and `:`, which every backend stores as written"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_and_escapes_decode() {
        for ok in [
            "dlock",
            "app",
            "billing.prod",
            "tenant_7",
            "a:b",
            "x-y",
            "rw",
        ] {
            assert_eq!(parse(ok).as_deref(), Ok(ok));
        }
        assert_eq!(parse("app%2Dx").as_deref(), Ok("app-x"));
    }

    #[test]
    fn names_that_reach_another_namespace_are_refused() {
        for (raw, says) in [
            ("", "empty"),
            ("app/x", "`/`"),
            ("app%2Fx", "`/`"),
            ("locks/", "`/`"),
            ("{x}", "hash tag"),
            ("a{}", "hash tag"),
            ("dlock-semaphores", "-semaphores"),
            ("dlock-rw", "-rw"),
            ("app-election", "-election"),
            ("zookeeper", "keep for themselves"),
            ("..", "keep for themselves"),
            ("a b", "' '"),
            ("ключ", "ASCII"),
            ("a\u{0}b", "ASCII"),
            ("%zz", "two hex digits"),
        ] {
            let err = parse(raw).unwrap_err();
            assert!(err.contains(says), "{raw:?}: {err}");
        }
        assert!(parse(&"p".repeat(MAX_LEN)).is_ok());
        assert!(parse(&"p".repeat(MAX_LEN + 1)).is_err());
    }
}
