//! Small URL helpers shared by `connect` and the backends.

/// Returns `url` with any password replaced by `***`, for `Debug`, errors and logs.
///
/// Works on every URL form dlock accepts, including multi-host ones
/// (`redlock://h1:1,h2:2`), which generic URL parsers reject, and on URLs
/// that do not parse at all: a password may hold `/`, `?`, `#` or `@`
/// unescaped, so everything up to the *last* `@` counts as credentials and
/// only a user name (the text before the first `:`, if it holds none of
/// those characters) is kept. That also hides a query value holding `@`:
/// showing too little is the safe side.
///
/// ```
/// assert_eq!(dlock::url::redact("redis://app:s3cret@10.0.0.1:6379/0"), "redis://app:***@10.0.0.1:6379/0");
/// assert_eq!(dlock::url::redact("redis://:s3cret@host"), "redis://:***@host");
/// assert_eq!(dlock::url::redact("redis://app:pa#ss/w@rd@host"), "redis://app:***@host");
/// assert_eq!(dlock::url::redact("etcd://h1:2379,h2:2379"), "etcd://h1:2379,h2:2379");
/// ```
pub fn redact(url: &str) -> String {
    let rest_start = url.find("://").map_or(0, |end| end + 3);
    let rest = &url[rest_start..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo
        .split_once(':')
        .map(|(user, _)| user)
        .filter(|user| !user.contains(['/', '?', '#', '@']));
    let redacted_userinfo = match user {
        Some(user) => format!("{user}:***"),
        // A lone userinfo is a password for redis (`redis://secret@host`),
        // and one whose "user" holds a delimiter may be all password.
        None => "***".to_owned(),
    };
    format!("{}{}{}", &url[..rest_start], redacted_userinfo, &rest[at..])
}

/// The scheme of `url` (the part before `://`), if it has one.
pub fn scheme(url: &str) -> Option<&str> {
    url.find("://").map(|end| &url[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_in_every_form() {
        assert_eq!(redact("redis://u:p@h:1/2"), "redis://u:***@h:1/2");
        assert_eq!(redact("rediss://u:p%40x@h"), "rediss://u:***@h");
        assert_eq!(redact("redis://pw@h"), "redis://***@h");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(redact("etcd://u:p@h1:1,h2:2"), "etcd://u:***@h1:1,h2:2");
    }

    #[test]
    fn hides_passwords_that_hold_delimiters() {
        for (url, want) in [
            (
                "redis://user:pa#ss@127.0.0.1:1",
                "redis://user:***@127.0.0.1:1",
            ),
            (
                "redis://user:pa?ss@127.0.0.1:1",
                "redis://user:***@127.0.0.1:1",
            ),
            (
                "redis://user:pa/ss@127.0.0.1:1",
                "redis://user:***@127.0.0.1:1",
            ),
            (
                "redis://user:p@ss@127.0.0.1:1",
                "redis://user:***@127.0.0.1:1",
            ),
            ("redis://pa#ss@127.0.0.1:1", "redis://***@127.0.0.1:1"),
            ("redis://us/er:pass@h", "redis://***@h"),
            ("zk://h:1/chroot?x=a@b", "zk://h:***@b"),
            ("redis//user:secret@h", "***@h"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn finds_the_scheme() {
        assert_eq!(scheme("redis+cluster://h:1"), Some("redis+cluster"));
        assert_eq!(scheme("h:1"), None);
    }
}
