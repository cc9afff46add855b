//! Small URL helpers shared by `connect` and the backends.

/// Returns `url` with any password replaced by `***`, for `Debug`, errors and logs.
///
/// Works on every URL form dlock accepts, including multi-host ones
/// (`redlock://h1:1,h2:2`), which generic URL parsers reject.
///
/// ```
/// assert_eq!(dlock::url::redact("redis://app:s3cret@10.0.0.1:6379/0"), "redis://app:***@10.0.0.1:6379/0");
/// assert_eq!(dlock::url::redact("redis://:s3cret@host"), "redis://:***@host");
/// assert_eq!(dlock::url::redact("etcd://h1:2379,h2:2379"), "etcd://h1:2379,h2:2379");
/// ```
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    // The authority ends at the first '/', '?' or '#'; userinfo ends at its last '@'.
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let redacted_userinfo = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        // A lone userinfo is a password for redis (`redis://secret@host`): hide it too.
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
        assert_eq!(redact("zk://h:1/chroot?x=a@b"), "zk://h:1/chroot?x=a@b");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(redact("etcd://u:p@h1:1,h2:2"), "etcd://u:***@h1:1,h2:2");
    }

    #[test]
    fn finds_the_scheme() {
        assert_eq!(scheme("redis+cluster://h:1"), Some("redis+cluster"));
        assert_eq!(scheme("h:1"), None);
    }
}
